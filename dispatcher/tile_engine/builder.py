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


def build(config_dict: dict):
    """(name, BuiltLibrary, None) on success, (name, None, first error lines)
    on failure: one kernel into this host's build cache. Any executor's
    build step runs this, in whatever process it builds in."""
    from ..dispatch import Dispatcher
    config = KernelConfig.from_dict(config_dict)
    d = Dispatcher(tuning=None)
    try:
        return config.name, d.build(d.codegen(config)), None
    except BuildError as e:
        return config.name, None, str(e)
    except DispatcherError as e:
        return config.name, None, f"{type(e).__name__}: {e}"


def _build_in_pool(config_dict: dict):
    """In a pool process: (name, cache key or None, error or None)."""
    name, built, error = build(config_dict)
    return name, built and built.key, error


def exit_with_parent(parent: int):
    """Exit when the process `parent` (the sweep, or a slot's actor) is gone,
    checked at once and then every PARENT_POLL_SECONDS by a daemon thread
    (an orphan's parent changes: it is adopted by init or a subreaper)."""
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int):
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def unique(configs) -> list:
    """The distinct kernels of `configs`, by name."""
    return list({c.name: c for c in configs}.values())


def tally(outcomes, total: int, progress: bool = True):
    """({name: cache key}, [(name, error)]) from (name, key, error) outcomes
    as they finish, with a progress bar of `total` builds."""
    built, failures = {}, []
    bar = tqdm(total=total, desc="build", unit="kernel", disable=not progress, file=sys.stderr)
    for name, key, error in outcomes:
        if error:
            failures.append((name, error))
        else:
            built[name] = key
        bar.set_postfix(ok=len(built), failed=len(failures))
        bar.update()
    bar.close()
    return built, failures


def build_all(configs, workers: int = 0, progress: bool = True):
    """({name: cache key}, [(name, error)]) for the distinct kernels of
    `configs`, built by a pool of local processes."""
    todo = unique(configs)
    workers = workers or os.cpu_count() or 1
    # spawn: each worker's parent is this process whatever the platform's
    # default start method (a forkserver would be the parent instead)
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
        futures = [pool.submit(_build_in_pool, c.to_dict()) for c in todo]
        return tally((f.result() for f in as_completed(futures)), len(futures), progress)
