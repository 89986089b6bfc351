"""Token selection shared by the generator (data/) and the speculative engine (evaluate/).

Temperature, then top-k, then top-p (nucleus), the order transformers applies them in;
temperature 0 means greedy. Keeping one implementation means the target's stored outputs
and the engine's samples follow exactly the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """Applied identically to target and draft. temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus), then softmax. (..., V) -> (..., V) fp32."""
    logits = logits.float() / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already cover top_p (the first always stays)
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sampling.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)
