"""Draft and verify costs: the three cost ratios behind the recommended k.

What the k recommendation needs is not a wall-clock race but three cost ratios of this
hardware: a 1-token draft forward (c), and a (k+1)-token verify forward (v_k), each over a
1-token target forward. They are timed as every timing in draftsmith is
(draftsmith/clock.py: a warm fixed cache, interleaved repeats in rotated order), the ratios
taken within a repeat (paired), then summarised over R repeats by their median and
interquartile range (IQR).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftsmith.clock import Step, cached_forward, interleaved, prefilled, quartiles
from draftsmith.decode_step import decode_logits
from draftsmith.fast_linear import cpu_few_row_linear
from draftsmith.kv_cache import crop_cache

TARGET, DRAFT = "target_1tok", "draft_1tok"


def verify_name(k: int) -> str:
    return f"verify_{k + 1}tok"


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


def causal_lm_draft_step(draft, context: Sequence[int], token: int) -> Step:
    """A causal-LM draft's proposal step: one 1-token step with its own KV cache, taken as
    the engine takes it (decode_step.decode_logits: the fast step where the model has one)."""
    cache, keep, device = prefilled(draft, context)
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
