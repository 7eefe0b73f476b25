"""The core's default hook implementations (registered as `dispatcher.defaults`).

They run last (`trylast`), so any variant plugin can answer first:
`dispatcher_build` compiles with the target's toolchain, and
`dispatcher_select_library` asks the tuning database, then takes the best
ranked candidate (`dispatcher.selection`: the target's performance model,
else an occupancy model; deterministic).
"""

from __future__ import annotations

from . import selection
from .hookspecs import hookimpl


@hookimpl(trylast=True)
def dispatcher_build(source, target, cache):
    return cache.build(source, target.toolchain(source.config))


@hookimpl(trylast=True)
def dispatcher_select_library(problem, candidates, tuning, record):
    if tuning is not None:  # asked even when no default config builds here
        tuned = tuning.lookup(problem, record)
        if tuned is not None:
            return tuned
    if not candidates:
        return None
    return selection.rank(problem, candidates, record)[0].config
