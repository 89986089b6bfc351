"""Greedy acceptance from one teacher-forced draft pass: the engine's counts without decoding.

Greedy speculative decoding only ever extends the target's own greedy output, so whether a
drafted token is accepted is fixed by one question per output position i: does the draft's
argmax, fed the prompt and the target's first i output tokens, equal the target's token i?
One forward of the draft over prompt + target output answers all of them at once, and
`metrics.greedy_rounds` replays the rounds the engine would take (tests/test_specdec.py
and tests/test_teacher_forced.py check the counts equal the engine's).

What it cannot give: timings (so no measured speedup or cost ratio) and the lossless
check (nothing is decoded). The evaluate stage uses it to rank every checkpoint on every
prompt cheaply and runs the real engine on the best drafts; each leaderboard row says
which one measured it (`measured_by`).

The one caveat is numerical: a batched pass over T positions and the engine's cached
1-token steps sum in different orders, so a near-tied argmax can flip. In fp32 that is
rare (the equality test uses float64 to rule it out; on the real target the two agreed
exactly on the runs compared in the README).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftsmith.evaluate import metrics


@torch.inference_mode()
def draft_agreement(
    draft, prompt_ids: Sequence[int], target_tokens: Sequence[int], vocab: int | None = None
) -> list[bool]:
    """Per target output token: does the draft's teacher-forced argmax equal it?

    `vocab`: the target's vocabulary size; like the engine, the draft's argmax is taken over
    the target's ids only (a draft may carry padding rows past them).
    """
    n = len(target_tokens)
    if n == 0:
        return []
    device = next(draft.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(target_tokens[:-1])], device=device)  # (1, P+n-1)
    logits = draft(input_ids=ids, logits_to_keep=n).logits[0, :, :vocab]  # (n, V)
    return (logits.argmax(-1) == torch.tensor(list(target_tokens), device=device)).tolist()


def replay(agree: Sequence[bool], tokens: Sequence[int], k: int, budget: int) -> dict:
    """A per-prompt result dict with the engine's count fields (no timings) for k drafts/round."""
    rounds = metrics.greedy_rounds(agree, k, budget)
    return {
        "tokens": list(tokens),
        "k": k,
        "proposed": rounds["proposed"],
        "accepted": rounds["accepted"],
        "accepted_at": rounds["accepted_at"],
        "reached_at": rounds["reached_at"],
        "target_forwards": rounds["rounds"],
        "draft_forwards": rounds["proposed"],
        "draft_1tok_time": 0.0,
        "draft_1tok_n": 0,
        "target_1tok_time": 0.0,
        "target_1tok_n": 0,
        "target_verify_time": 0.0,
        "target_verify_n": 0,
        "wall_time": 0.0,
    }


def teacher_forced_results(
    draft, refs: Sequence[dict], k: int, max_new_tokens: int, vocab: int | None = None
) -> list[dict]:
    """refs: per prompt {"id", "category", "prompt_ids", "tokens": the target's greedy output
    under `max_new_tokens`}."""
    out = []
    for r in refs:
        agree = draft_agreement(draft, r["prompt_ids"], r["tokens"], vocab)
        out.append(
            {
                "id": r["id"],
                "category": r["category"],
                **replay(agree, r["tokens"], k, max_new_tokens),
            }
        )
    return out


def greedy_refs(target, eos_ids, prompts: Sequence[dict], max_new_tokens: int) -> list[dict]:
    """The target's own greedy output per prompt, by the engine's target-only decoding (batch
    1, the same kernels and caches the speculative runs are checked against)."""
    from draftsmith.evaluate.engine import SpeculativeDecoder

    decoder = SpeculativeDecoder(target, eos_ids=eos_ids)
    return [
        {**p, "tokens": decoder.generate(p["prompt_ids"], max_new_tokens).tokens} for p in prompts
    ]
