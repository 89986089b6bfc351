"""What a backend returns for one sampled completion, and the EOS rule both backends share.

EOS policy (both backends): `completion_ids` runs up to and INCLUDING the first
EOS token when the target emitted one (the draft must learn to stop too), and
nothing after it: padding a batched backend writes after EOS never appears.
A completion without EOS stopped at `max_new_tokens` (finish_reason "length").
`topk_ids` / `topk_logprobs` have one row per completion token, the EOS included.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Completion:
    token_ids: list[int]
    finish_reason: str  # "stop" (ended with EOS) | "length"
    topk_ids: list[list[int]] | None = None  # (C, k)
    topk_logprobs: list[list[float]] | None = None  # (C, k), float32, temperature 1


def cut_at_eos(token_ids: list[int], eos_ids: set[int]) -> tuple[int, str]:
    """(length to keep, finish_reason): through the first EOS, or everything."""
    for i, t in enumerate(token_ids):
        if t in eos_ids:
            return i + 1, "stop"
    return len(token_ids), "length"
