"""Each kernel's run time as a function of the problem, fitted to the times a
tuning database measured; selection's answer for problems it did not measure.

Why a fit: the database measures every catalog kernel on a grid of
problems (the tile engine's sweeps), so each kernel's own times span the
grid. Read as a curve, they answer a problem between grid points better
than the nearest grid points' winners or NVIDIA's analytic model. Replayed
on 60 bf16 rcr shapes (50 random ones and the corpus, H100,
benchmarks/results/cuda_gemm_random_h100_7baa014.json; the fits saw the
shipped sweeps' 86 grid problems, not these shapes, but these shapes helped
choose the guards below): default kernel over the catalog's best, geomean
1.027 and worst 1.16 on the 55 whose pick that run timed, against 1.066 and
1.53 for the nearest tuned problems with NVIDIA's model beyond them.
That model put split-K first on few-tile problems (86x95x268 ran 1.53x
slower than the best): it expects hundreds of
microseconds for one CTA of 128x128x6060, where the GPU takes tens.
The work term (e below) was added after the GPU confirmed the fits on a
second draw of 50 (regret 1.033, worst 1.165); replayed on both draws and
the corpus (benchmarks/results/cuda_gemm_*_h100_47d1411.json, 110 shapes),
it gives 1.021 and worst 1.19 on the 102 whose pick those runs timed,
against 1.028 and 1.17, and 64x4096x4096 1.00 against 1.17; 8 picks are
hybrid kernels those runs did not time.

The model of one kernel (its tile, cluster, schedule and split are fixed,
so only the problem varies):

    time = a + waves * (b + c * k_tiles) + d * partial_megabytes + e * work

waves: the work items (output tiles as the target launches them,
`launched_tiles`, times the variant's `k_splits`) over the target's
workers, rounded up unless the variant shares its last wave out (then as
the target's `shared_waves` counts them); k_tiles: the K tiles one work
item computes; partial_megabytes: the fp32 partial sums a split kernel
writes and reads back, or a shared wave's tiles that run in pieces (the
target's `shared_waves`); work: the work items times
their K tiles over the workers, unrounded. a is the launch and prologue,
b a work item's fixed cost (its epilogue, scheduling), c a K tile's, d
the reduction's; e is what a K tile costs for the memory all work items
share: where one wave holds every tile (M = 64, N up to 8192 on 64x64
tiles), waves and K tiles do not change with N, but the bytes streamed do,
and so does the time (64x2048x2048 10.7 us, 64x8192x2048 21.9 us on the
H100; without e the fits put tree split-K first on 64x4096x4096, 1.17x
slower than the best). Coefficients are fitted by least squares on
relative error and kept non-negative (every subset of them is tried: five
unknowns); a kernel measured at fewer than `MIN_PROBLEMS` problems gets no
fit, and neither does a database of winners only (autotune's rows, an old
export): a kernel's times there are where it won, no curve to compare.

A fit answers only within its kernel's measured sizes, a factor of 2
beyond them (past the database's own range, where every kernel's fit
extrapolates alike, without bound): an export keeps a problem's kernels
within 1.5x of its fastest (`tuning.EXPORT_WITHIN`), so a kernel may be
measured only where it competes. Fitted to large problems alone, 256x128
split-K 2 in a 2x4 cluster extrapolated to the fastest on 86x95x268.

What the five terms cannot see (a cluster shape that suits some tile grids
badly, the L2's reuse at some sizes) a fit misses by about 5-10% on
average, and between kernels whose fits lie that close, that error picks.
So a prediction is corrected by the fit's own error at the tuned problems
near it (`FittedKernel.correction`): at 1024 x 1024 x 2816 (a 1024-token
MLP's GEMM, H100) the fits put 64x128 in a 2x4 cluster first (18.2 us
fitted, 22.6 measured); 128x64 in no cluster, fitted 19.3, had run 13%
faster than its fit at both tuned problems near it, and it ran in 16.5.
With the correction and the pieces of hybrid kernels' shared waves,
replayed on 204 shapes the H100 timed (three random draws, the corpus and
54 MLP GEMMs in their layouts, benchmarks/results/cuda_gemm_*_5f2c3a9.json
and *_47d1411.json), regret went from 1.028 (worst 1.39) to 1.021 (worst
1.19); the MLP GEMMs' from 1.043 to 1.012, the random draws' from 1.025
to 1.026.
"""

from __future__ import annotations

import functools
import itertools
import math

import attrs
import numpy as np

from . import targets
from .selection import k_tile_count, work_waves

# The fewest tuned problems one kernel's fit needs: the sweeps' grids hold 54
# (cuda_tuning_grid) and more, a hand-tuned database a few, which the nearest
# tuned problems answer instead.
MIN_PROBLEMS = 12
# How far past its own measured sizes a kernel's fit answers (module docstring).
REACH = 2.0
# How near (log2 distance over the tuning sizes) a tuned problem's fitting
# error corrects a kernel's fit (module docstring): 1.5 reaches a problem up
# to 2.8x larger in one size, with less weight the farther it is.
CORRECTION_RADIUS = 1.5


@attrs.frozen
class FittedKernel:
    """One kernel's fitted time model (module docstring)."""
    config: object
    coefficients: tuple  # (a, b, c, d, e) in milliseconds
    problems: int  # the tuned problems it was fitted to
    error: float  # the fit's mean relative error on them
    low: tuple  # the tuning sizes it answers for (module docstring), each from low to high
    high: tuple
    # per tuned problem, the log2 of its sizes (a row) and log(measured / fitted ms): `correction`'s
    tuned_at: np.ndarray = attrs.field(factory=lambda: np.empty((0, 0)), eq=False)
    errors: np.ndarray = attrs.field(factory=lambda: np.empty(0), eq=False)

    def predicted_ms(self, problem, record, sizes) -> float:
        """Its time on `problem` (of tuning sizes `sizes`): the fit's, times
        the fit's error at the tuned problems nearby (`correction`)."""
        return float(np.dot(features(problem, self.config, record), self.coefficients)) * self.correction(sizes)

    def correction(self, sizes) -> float:
        """How far off the fit was on the tuned problems within
        `CORRECTION_RADIUS` of `sizes` (log2 distance over the sizes): the
        exponential of their log(measured / fitted), weighted by closeness;
        1 where none is that near."""
        if not self.errors.size:
            return 1.0
        here = np.log2(np.asarray(sizes, dtype=float))
        weights = 1.0 - np.linalg.norm(self.tuned_at - here, axis=1) / CORRECTION_RADIUS
        near = weights > 0
        return math.exp(float(weights[near] @ self.errors[near] / weights[near].sum())) if near.any() else 1.0

    def answers(self, sizes) -> bool:
        """Whether a problem of these tuning sizes is within its range."""
        return all(lo <= x <= hi for lo, x, hi in zip(self.low, sizes, self.high))


def features(problem, config, record) -> tuple:
    """(1, waves, waves * k_tiles, partial megabytes, work) of `config` on
    `problem` (module docstring)."""
    target = targets.get(config.target)
    tiles = target.launched_tiles(problem, config)
    tile_k_count = k_tile_count(problem, config)
    waves, splits, in_pieces = work_waves(tiles, tile_k_count, config, record)
    k_tiles = math.ceil(tile_k_count / splits)
    if splits > 1:
        partial = sum(m * n for m, n, _ in problem.shapes) * splits * 4e-6
    else:  # a shared last wave's tiles summed from pieces (the target's `shared_waves`), if any
        partial = in_pieces * config.tile_m * config.tile_n * 4e-6
    work = tiles * splits * k_tiles / target.parallelism(config)
    return (1.0, waves, waves * k_tiles, partial, work)


def fit(samples, record) -> dict:
    """{kernel name: FittedKernel} from `samples`, ((tuning sizes, problem,
    config, ms), ...) of one scope; kernels measured at fewer than
    MIN_PROBLEMS problems are left out."""
    by_kernel, kernels_at = {}, {}
    for sizes, problem, config, ms in samples:
        if not ms > 0:  # (a time of 0 recorded by hand: no relative error to fit)
            continue
        times = by_kernel.setdefault(config.name, (config, {}))[1]
        times[sizes, problem] = min(ms, times.get((sizes, problem), math.inf))
        kernels_at.setdefault(sizes, set()).add(config.name)
    if sum(len(k) > 1 for k in kernels_at.values()) * 2 < len(kernels_at):
        return {}  # winners only (autotune's, an old export): each kernel's times are where it won, no curve
    scope = [sizes for sizes, *_ in samples]
    scope_low, scope_high = (tuple(map(f, zip(*scope))) for f in (min, max)) if scope else ((), ())
    fitted = {}
    for name, (config, times) in by_kernel.items():
        if len(times) < MIN_PROBLEMS:
            continue
        x = np.array([features(p, config, record) for _, p in times])
        t = np.array(list(times.values()))
        try:
            found = _non_negative_fit(x / t[:, None], np.ones(len(t)))
        except np.linalg.LinAlgError:
            continue
        if found is None:
            continue
        low, high = (tuple(map(f, zip(*(sizes for sizes, _ in times)))) for f in (min, max))
        predicted = x @ found
        fitted[name] = FittedKernel(
            config, tuple(map(float, found)), len(times), float(np.mean(np.abs(predicted / t - 1.0))),
            tuned_at=np.log2([sizes for (sizes, _), fit_ms in zip(times, predicted) if fit_ms > 0]),
            errors=np.log(t[predicted > 0] / predicted[predicted > 0]),
            low=tuple(0.0 if lo <= s else lo / REACH for lo, s in zip(low, scope_low)),
            high=tuple(math.inf if hi >= s else hi * REACH for hi, s in zip(high, scope_high)))
    return fitted


def _non_negative_fit(x, y):
    """The least-squares solution of x c = y with every c >= 0, by trying
    each subset of x's columns (exact for these few columns), or None."""
    best, best_residual = None, math.inf
    columns = range(x.shape[1])
    for size in range(1, x.shape[1] + 1):
        for subset in itertools.combinations(columns, size):
            c, *_ = np.linalg.lstsq(x[:, subset], y, rcond=None)
            if (c < 0).any():
                continue
            residual = float(np.sum((x[:, subset] @ c - y) ** 2))
            if residual < best_residual - 1e-12:
                best = np.zeros(x.shape[1])
                best[list(subset)] = c
                best_residual = residual
    return best


@functools.lru_cache(maxsize=64)
def fitted_kernels(template, record, rows: tuple, parse, workers: str) -> dict:
    """`fit` of a database's rows ((sizes, config text, ms), ...) of one
    scope (`parse`: a config text's KernelConfig), each tuned problem as
    `template` (a problem of the scope's kind, at any sizes, whose kind's
    `at_tuning_sizes` gives problems back) at its sizes;
    memoized: a database's rows change seldom, and selection asks once per
    new problem shape. `workers` (the target's `parallelism_hint`) is part
    of the key: the waves are counted over this machine's workers."""
    return fit([(tuple(sizes), template.at_tuning_sizes(sizes), parse(text), ms) for sizes, text, ms in rows],
               record)
