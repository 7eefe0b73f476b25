"""One set of timing knobs for every path (CLI, benchmarks, tile engine).

Medians over repeated runs after warm-up; the GPU path (CUDA events, L2
flush, rotating inputs) plugs in through the same `TimingOptions`.
"""

from __future__ import annotations

import statistics
import time

import attrs


@attrs.frozen
class TimingOptions:
    warmup: int = attrs.field(default=3, validator=attrs.validators.ge(0))
    repeat: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    rotating: int = attrs.field(default=1, validator=attrs.validators.ge(1))  # input sets cycled (GPU)
    flush_l2: bool = True                                                     # GPU only


def measure(fn, options: TimingOptions = TimingOptions()) -> list:
    """Wall-clock seconds of each of `options.repeat` calls of fn(i), after
    `options.warmup` untimed calls; i cycles over the rotating input sets."""
    for i in range(options.warmup):
        fn(i % options.rotating)
    times = []
    for i in range(options.repeat):
        start = time.perf_counter()
        fn(i % options.rotating)
        times.append(time.perf_counter() - start)
    return times


def median(times) -> float:
    return statistics.median(times)
