"""Ranking candidate configs for a problem, without running anything.

Every candidate gets an `Estimate`: the target's performance model where
it has one that knows the config (on cuda, NVIDIA's analytic
`nvidia-matmul-heuristics`, in microseconds), else the core's occupancy
model (relative cost: waves of block tiles over the target's workers).
Estimates of the first kind rank before those of the second; ties go to
the config name, so a ranking is deterministic. The default selection
takes the first, `autotune` times the first few, the status -2 fallback
walks on down the list, and `gemm-dispatcher explain` prints it.
"""

from __future__ import annotations

import math

import attrs

from . import targets

OCCUPANCY = "occupancy model (relative cost)"


@attrs.frozen
class Estimate:
    config: object
    value: float
    model: str
    tier: int  # 0: the target's model, 1: the occupancy model

    @property
    def key(self) -> tuple:
        # an infinite estimate (a kernel that cannot run the problem) after every tier's finite ones
        return (math.isinf(self.value), self.tier, self.value, self.config.name)


def estimate(problem, config, record) -> Estimate:
    """`config`'s estimate on `problem` (see the module docstring); record:
    the config's variant (its `k_splits`)."""
    target = targets.get(config.target)
    splits = record.k_splits(config) if record is not None else 1
    found = target.model_estimate(problem, config, splits)
    if found is not None:
        return Estimate(config, found, target.model_name_of(config), 0)
    return Estimate(config, estimated_cost(problem, config, record), OCCUPANCY, 1)


def rank(problem, candidates, record) -> list:
    """`candidates` (configs of the variant `record`) as Estimates, best first."""
    return sorted((estimate(problem, c, record) for c in candidates), key=lambda e: e.key)


def k_tile_count(problem, config) -> int:
    """The K tiles of `problem`'s deepest GEMM under `config`'s tile_k."""
    return math.ceil(max(k for _, _, k in problem.shapes) / config.tile_k)


def work_waves(tiles: int, k_tiles: int, config, record=None) -> tuple:
    """(waves, K slices per tile, work items run in pieces) of `tiles`
    output tiles of `k_tiles` K tiles each: their work items (each tile in
    the variant's `k_splits` slices) over the target's workers, rounded up
    to whole waves, unless the variant shares its last wave out
    (`shares_last_wave`: then as the target's `shared_waves` counts)."""
    target = targets.get(config.target)
    workers = target.parallelism(config)
    splits = record.k_splits(config) if record is not None else 1
    items = tiles * splits
    if record is not None and record.shares_last_wave(config):
        waves, in_pieces = target.shared_waves(items, workers, k_tiles)
        return waves, splits, in_pieces
    return float(math.ceil(items / workers)), splits, 0


def estimated_cost(problem, config, record=None) -> float:
    """Relative time of `config` on `problem`: the waves of work items over
    the target's parallel workers, each costing the area it computes (the
    target's `computed_tile`: the whole tile, or on the cpu only the
    micro-tiles a problem smaller than the tile covers) plus the overhead of
    loading its A and B blocks, which makes small tiles slow. A work item is
    a block tile, or with K split (`record.k_splits`) one slice of it, which
    costs its share of K; a kernel that shares a partial last wave's tiles
    out over all the workers (`record.shares_last_wave`: the regular
    variant's hybrid decomposition) counts its waves as its target's
    `shared_waves` does. A B block a worker reuses for several tiles in a
    row (the target's `panel_reuse`) costs its share once, and so does an A block
    where the variant packs A once (`record.packs_a_once`, the target's
    `a_panel_reuse`); all of it over the target's `compute_rate` of the
    config (a faster instruction, e.g. the CPU's AMX against a fallback
    micro-kernel of the same spec)."""
    target = targets.get(config.target)
    workers = target.parallelism(config)
    waves, splits, _ = work_waves(problem.tile_count(config.tile_m, config.tile_n), k_tile_count(problem, config),
                                  config, record)
    reuse = target.panel_reuse(problem, config, workers)
    a_reuse = target.a_panel_reuse(problem, config) if record is not None and record.packs_a_once else 1
    rows, columns = target.computed_tile(problem, config)
    per_tile = rows * columns + 24.0 * rows / a_reuse + 24.0 * columns / reuse
    return waves * per_tile / splits / target.compute_rate(config)
