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


def spread(times) -> float:
    """The noise of repeated timings, relative to their median: half the
    interquartile range over the median (0 for fewer than 4 samples)."""
    ordered = sorted(times)
    if len(ordered) < 4:
        return 0.0
    q1, q3 = ordered[len(ordered) // 4], ordered[(3 * len(ordered)) // 4]
    return (q3 - q1) / 2 / median(ordered)


def median(times) -> float:
    return statistics.median(times)


def measure_cuda(fn, options: TimingOptions = TimingOptions(), stream: int = 0) -> list:
    """Seconds of each of `options.repeat` calls of fn(i) on the GPU, from CUDA
    events recorded around each call on `stream` (the current stream when
    0), after `options.warmup` calls. With `flush_l2`, a buffer larger
    than the L2 cache is overwritten before each timed call (outside the
    events), so every call starts with cold caches."""
    from .targets.cuda_runtime import runtime

    rt = runtime()
    record, elapsed = rt.event_timer(stream)
    flush = rt.empty(256 << 20, stream) if options.flush_l2 else None
    for i in range(options.warmup):
        fn(i % options.rotating)
    times = []
    for i in range(options.repeat):
        if flush is not None:
            rt.memset(flush[0], i & 0xFF, 256 << 20, stream)
        start = record()
        fn(i % options.rotating)
        stop = record()
        times.append(elapsed(start, stop))
    return times
