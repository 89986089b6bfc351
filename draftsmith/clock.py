"""Timings that hold still: one clock reading, interleaved repeats, quartiles, a cached forward.

A forward timed once on a shared machine is one draw from a wide distribution (README,
"The recommended k", has the spread measured on identical runs). Every timing in draftsmith
(evaluate's cost ratios, the linear-layer form chosen per forward width, the benchmarks
under scripts/) is taken as a microbenchmark would take it:

- every forward runs on one fixed context with a warm KV cache, cropped back after each
  run, so every repeat times the same work (`cached_forward`);
- one repeat times each step once, back to back, in an order rotated every repeat: a
  burst of load from another process lands on all of them alike, and no step is always
  the first after a pause (`interleaved`);
- repeats are summarised by their median and interquartile range (`quartiles`), which a
  few slow outliers do not move.

`time_step` is the one clock reading; tests replace it to inject noisy timings.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch

from draftsmith.kv_cache import cache_kwarg, crop_cache, new_cache

# (run, reset): `run` is timed, `reset` (crop the cache back) is not
Step = tuple[Callable[[], None], Callable[[], None]]


def time_step(name: str, run: Callable[[], None], sync: Callable[[], None]) -> float:
    """Seconds one run of step `name` takes (`name` lets a test inject timings by step)."""
    sync()
    start = time.perf_counter()
    run()
    sync()
    return time.perf_counter() - start


def interleaved(
    steps: dict[str, Step], repeats: int, warmup: int = 2, sync: Callable[[], None] = lambda: None
) -> dict[str, list[float]]:
    """{step: seconds per repeat}: each repeat runs every step once, the order rotated by one
    each repeat; `warmup` untimed rounds first (allocator, caches, lazy kernels)."""
    names = list(steps)
    for _ in range(warmup):
        for run, reset in steps.values():
            run()
            reset()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            run, reset = steps[name]
            times[name].append(time_step(name, run, sync))
            reset()
    return times


def quartiles(xs: Sequence[float]) -> list[float]:
    """[q25, median, q75] (inclusive method: a single value gives three equal ones)."""
    if len(xs) == 1:
        return [xs[0]] * 3
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return [q1, q2, q3]


def prefilled(model, context: Sequence[int]):
    """(cache holding `context`, its length, the model's device)."""
    device = next(model.parameters()).device
    cache, kw = new_cache(model), cache_kwarg(model)
    with torch.inference_mode():
        ids = torch.tensor([list(context)], device=device)  # (1, C)
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
    return cache, cache.get_seq_length(), device


def cached_forward(model, context: Sequence[int], feed: Sequence[int]) -> Step:
    """A forward of `feed` (1 or k+1 tokens) on top of a cache holding `context`."""
    cache, keep, device = prefilled(model, context)
    kw = cache_kwarg(model)
    ids = torch.tensor([list(feed)], device=device)  # (1, n)

    def run() -> None:
        model(input_ids=ids, use_cache=True, logits_to_keep=ids.shape[1], **{kw: cache})

    return run, lambda: crop_cache(cache, keep)
