"""Build phase: every kernel of a sweep into the build cache, in parallel
processes, with a progress bar. Never loads a library."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm import tqdm

from ..config import KernelConfig
from ..errors import BuildError, DispatcherError


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


def build_all(configs, workers: int = 0, progress: bool = True):
    """(names built, [(name, error)]) for the distinct kernels of `configs`."""
    unique = {c.name: c for c in configs}
    workers = workers or os.cpu_count() or 1
    built, failures = [], []
    with ProcessPoolExecutor(max_workers=workers) as pool:
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
