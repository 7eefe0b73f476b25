"""The core's default hook implementations (registered as `dispatcher.defaults`).

They run last (`trylast`), so any variant plugin can answer first:
`dispatcher_build` compiles with the target's toolchain, and
`dispatcher_select_library` asks the tuning database, then a deterministic
occupancy heuristic.
"""

from __future__ import annotations

import math

from . import targets
from .hookspecs import hookimpl


@hookimpl(trylast=True)
def dispatcher_build(source, target, cache):
    return cache.build(source, target.toolchain(source.config))


@hookimpl(trylast=True)
def dispatcher_select_library(problem, candidates, tuning):
    if tuning is not None:  # asked even when no default config builds here
        tuned = tuning.lookup(problem, candidates)
        if tuned is not None:
            return tuned
    if not candidates:
        return None
    return min(candidates, key=lambda c: (estimated_cost(problem, c), c.name))


def estimated_cost(problem, config) -> float:
    """Relative time of `config` on `problem`: the waves of block tiles over
    the target's parallel workers, each costing its padded area plus the
    overhead of loading its A and B blocks, which makes small tiles slow. A
    B block a worker reuses for several tiles in a row (the target's
    `panel_reuse`) costs its share once."""
    target = targets.get(config.target)
    workers = target.parallelism(config)
    tiles = problem.tile_count(config.tile_m, config.tile_n)
    waves = math.ceil(tiles / workers)
    reuse = target.panel_reuse(problem, config, workers)
    per_tile = config.tile_m * config.tile_n * (1.0 + 24.0 / config.tile_n
                                                + 24.0 / (config.tile_m * reuse))
    return waves * per_tile
