"""Draft and verify costs measured so that they hold still: interleaved, repeated, median.

A speedup timed once on a shared machine is one draw from a wide distribution (README,
"The recommended k", has the spread measured on identical runs). What the k
recommendation needs is not a wall-clock race but three cost ratios of this hardware: a
1-token draft forward (c), and a (k+1)-token verify forward (v_k), each over a 1-token
target forward. This module measures them as a microbenchmark would:

- every forward runs on one fixed context with a warm KV cache, cropped back after each
  run, so every repeat times the same work;
- one repeat times each forward once, back to back, in an order rotated every repeat: a
  burst of load from another process lands on all of them alike, and no forward is
  always the first after a pause;
- the ratios are taken within a repeat (paired), then summarised over R repeats by their
  median and interquartile range (IQR), which a few slow outliers do not move.

`time_step` is the one clock reading; tests replace it to inject noisy timings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from draftsmith.decode_step import decode_logits
from draftsmith.evaluate.metrics import quartiles
from draftsmith.fast_linear import (
    F_LINEAR,
    FEW_ROW,
    PACKED,
    FormSwitch,
    cpu_few_row_linear,
    drop_packed,
    packable,
)
from draftsmith.kv_cache import cache_kwarg, crop_cache, new_cache

# (run, reset): `run` is timed, `reset` (crop the cache back) is not
Step = tuple[Callable[[], None], Callable[[], None]]
TARGET, DRAFT = "target_1tok", "draft_1tok"


def verify_name(k: int) -> str:
    return f"verify_{k + 1}tok"


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


def cost_ratios(times: dict[str, list[float]], ks: Sequence[int]) -> dict:
    """Per-repeat c and v_k (each over the same repeat's 1-token target forward), with the
    per-forward milliseconds, all as [q25, median, q75]."""
    base = times[TARGET]
    c = [d / t for d, t in zip(times[DRAFT], base)]
    v = {k: [x / t for x, t in zip(times[verify_name(k)], base)] for k in ks}
    return {
        "repeats": len(base),
        "c": c,  # per repeat, for the modelled speedup's spread
        "v": {str(k): vs for k, vs in v.items()},
        "draft_cost_ratio": quartiles(c),
        "verify_cost_ratio": {str(k): quartiles(vs) for k, vs in v.items()},
        "ms": {name: [1e3 * x for x in quartiles(ts)] for name, ts in times.items()},
    }


# ----------------------------------------------------------------------------- model steps


def _prefilled(model, context: Sequence[int]):
    """(cache holding `context`, its length, the model's device)."""
    device = next(model.parameters()).device
    cache, kw = new_cache(model), cache_kwarg(model)
    with torch.inference_mode():
        ids = torch.tensor([list(context)], device=device)  # (1, C)
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
    return cache, cache.get_seq_length(), device


def cached_forward(model, context: Sequence[int], feed: Sequence[int]) -> Step:
    """A forward of `feed` (1 or k+1 tokens) on top of a cache holding `context`."""
    cache, keep, device = _prefilled(model, context)
    kw = cache_kwarg(model)
    ids = torch.tensor([list(feed)], device=device)  # (1, n)

    def run() -> None:
        model(input_ids=ids, use_cache=True, logits_to_keep=ids.shape[1], **{kw: cache})

    return run, lambda: crop_cache(cache, keep)


def causal_lm_draft_step(draft, context: Sequence[int], token: int) -> Step:
    """A causal-LM draft's proposal step: one 1-token step with its own KV cache, taken as
    the engine takes it (decode_step.decode_logits: the fast step where the model has one)."""
    cache, keep, device = _prefilled(draft, context)
    ids = torch.tensor([[token]], device=device)  # (1, 1)
    return lambda: decode_logits(draft, ids, cache), lambda: crop_cache(cache, keep)


@torch.inference_mode()
def measure_costs(
    target,
    draft_step: Step,
    context: Sequence[int],
    continuation: Sequence[int],
    ks: Sequence[int],
    repeats: int,
    linear_forms=True,
    draft=None,
) -> dict:
    """c and v_k of `target` and one draft step on `context`, R interleaved repeats.

    continuation: the tokens fed after the context, repeated to max(ks) + 1 if short (their
    values do not change the cost). linear_forms: the engine's {width: form} of the linear
    layers (fast_linear.linear_forms). `draft`: the draft module, only so that fast_linear
    covers it as the engine does.
    """
    need = max(ks) + 1
    feed = (list(continuation) * need)[:need] if continuation else [0] * need
    steps = {
        TARGET: cached_forward(target, context, feed[:1]),
        DRAFT: draft_step,
        **{verify_name(k): cached_forward(target, context, feed[: k + 1]) for k in ks},
    }
    device = next(target.parameters()).device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with cpu_few_row_linear(target, draft, enabled=linear_forms):
        times = interleaved(steps, repeats, sync=sync)
    return {"context_tokens": len(context), **cost_ratios(times, ks)}


# ----------------------------------------------------------------------------- kernel choice


def in_form(step: Step, switch: FormSwitch, width: int, form: str) -> Step:
    """`step` (a forward `width` tokens wide) run with its linear layers in `form`: the
    switch is set just before the run, inside a cpu_few_row_linear(..., enabled=switch)."""
    run, reset = step

    def switched() -> None:
        switch.clear()
        switch[width] = form
        run()

    return switched, reset


@torch.inference_mode()
def choose_linear_forms(
    model, context: Sequence[int], widths: Sequence[int], repeats: int, margin: float = 0.03
) -> dict:
    """Which form of the linear layers a forward over w tokens should take on this machine,
    for each width w (a verify pass is k + 1 wide, a decode step 1), by timing them.

    The same cached forward runs through each form (draftsmith/fast_linear.py): F.linear,
    W @ x^T (one row padded to two at w = 1) and, where the model's weights can be packed
    (bf16 on CPU), F.linear's oneDNN kernel on weights packed once; interleaved and repeated
    like the cost timing. Another form is chosen over F.linear only where its median is
    lower by more than `margin`, the fastest of them where several are. Which one wins
    depends on the CPU, the BLAS and the dtype: measured, not assumed. Where no width takes
    the packed form, its copies are freed.
    Returns {"forms": {w: form}, "ms": {w: {form: ms}}, "repeats"} (w as strings, as in JSON).
    """
    widths = sorted({int(w) for w in widths if w >= 1})
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    forms = [F_LINEAR, FEW_ROW] + ([PACKED] if any(packable(m.weight) for m in linears) else [])
    switch = FormSwitch()
    feed = (list(context[-1:]) * max(widths, default=1))[: max(widths, default=1)]
    steps: dict[str, Step] = {}
    for w in widths:
        step = cached_forward(model, context, feed[:w])
        steps |= {f"{form}_{w}": in_form(step, switch, w, form) for form in forms}
    times = {}
    if steps:
        with cpu_few_row_linear(model, enabled=switch):
            times = interleaved(steps, repeats)
    ms, chosen = {}, {}
    for w in widths:
        ms[str(w)] = {form: 1e3 * quartiles(times[f"{form}_{w}"])[1] for form in forms}
        best = min(forms, key=lambda form: ms[str(w)][form])
        if ms[str(w)][best] < ms[str(w)][F_LINEAR] * (1 - margin):
            chosen[str(w)] = best
    if PACKED not in chosen.values():
        drop_packed(model)
    return {"forms": chosen, "ms": ms, "repeats": repeats}
