"""A reduced draft vocabulary: the draft proposes only the target's most frequent tokens.

A head over the whole target vocabulary is most of a small draft's cost (SmolLM2: 49k rows
of 576). FR-Spec and EAGLE-3 keep only the `draft_vocab_size` most frequent target tokens
in the draft's output layer; the target still verifies every proposal and its own token at
a miss can be any token, so the output stays the target's.

Layout (the one speculators and vLLM read, both in the draft's model.safetensors):

    d2t  (Vd,) int64  offsets: target_id = draft_id + d2t[draft_id]
    t2d  (V,)  bool   True for the Vd target ids that are in the draft vocabulary

Draft ids are the selected target ids in ascending order. That order is not a free choice:
t2d is a mask and carries no order of its own, and speculators takes the verifier's
lm_head rows for the draft vocabulary as `weight[t2d]` (ascending target id), the same
order its `build_vocab_mappings_from_distribution` sorts into. An unsorted d2t would
still decode in vLLM (it only reads d2t) but would disagree with t2d everywhere else.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from draftsmith.errors import ConfigError, DraftsmithError


class DraftVocab(NamedTuple):
    d2t: Tensor  # (Vd,) int64 offsets, target_id = draft_id + d2t[draft_id]
    t2d: Tensor  # (V,) bool, True where the target id is in the draft vocabulary

    @property
    def size(self) -> int:
        return self.d2t.numel()

    def target_ids(self) -> Tensor:
        return draft_to_target_ids(self.d2t)  # (Vd,)


def draft_to_target_ids(d2t: Tensor) -> Tensor:
    """(Vd,) target id of every draft id."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def build_draft_vocab(
    token_counts: Tensor, draft_vocab_size: int, target_vocab_size: int
) -> DraftVocab:
    """The `draft_vocab_size` most frequent target ids (ties: the lower id first).

    token_counts (V,): how often each target id occurs in the training text, e.g.
    `torch.bincount(ids, minlength=V)`. When fewer than draft_vocab_size ids occur, the
    rest are the lowest ids that never occurred (the same rule as speculators), so the
    draft vocabulary always has exactly draft_vocab_size entries.
    """
    if not 1 <= draft_vocab_size <= target_vocab_size:
        raise ConfigError(
            f"draft.eagle3.draft_vocab_size: {draft_vocab_size} must be between 1 and the target's "
            f"vocabulary size {target_vocab_size}"
        )
    counts = torch.as_tensor(token_counts).reshape(-1).to(torch.long)
    if counts.numel() != target_vocab_size:
        raise DraftsmithError(
            f"token counts cover {counts.numel()} ids but the target's vocabulary has "
            f"{target_vocab_size}: count with torch.bincount(ids, minlength=vocab_size)"
        )
    # a stable sort on -count keeps equal counts in ascending id order
    order = torch.argsort(-counts, stable=True)
    target_ids = order[:draft_vocab_size].sort().values  # (Vd,) ascending: draft id order
    d2t = target_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    return DraftVocab(d2t, t2d)


def draft_logits_to_target(draft_logits: Tensor, d2t: Tensor, target_vocab_size: int) -> Tensor:
    """(..., Vd) draft logits -> (..., V) scores over target ids, -inf outside the draft vocab.

    A softmax, an argmax or a sample over the result can never pick a token outside the
    draft vocabulary: its probability is exactly 0.
    """
    out = draft_logits.new_full((*draft_logits.shape[:-1], target_vocab_size), float("-inf"))
    out[..., draft_to_target_ids(d2t)] = draft_logits
    return out


def target_logits_on_draft_vocab(target_logits: Tensor, d2t: Tensor) -> Tensor:
    """(..., V) target logits -> (..., Vd) the same logits in draft id order.

    A softmax over the result is the target's distribution restricted to the draft
    vocabulary and renormalised: the teacher a reduced-vocabulary head can match.
    """
    return target_logits.index_select(-1, draft_to_target_ids(d2t).to(target_logits.device))


def target_probs_on_draft_vocab(
    target_logits: Tensor, d2t: Tensor, temperature: float = 1.0
) -> Tensor:
    """(..., V) target logits -> (..., Vd) p(token | token in draft vocab), fp32."""
    restricted = target_logits_on_draft_vocab(target_logits, d2t).float()
    return F.softmax(restricted / temperature, dim=-1)


def vocab_problem(d2t: Tensor, t2d: Tensor) -> str | None:
    """Why (d2t, t2d) is not a valid draft vocabulary, in one line; None when it is.

    Names the mistakes seen in published checkpoints: d2t left at zeros (vLLM then maps
    draft id i onto target id i, the first Vd ids), d2t written as arange, d2t holding
    the target ids themselves instead of offsets.
    """
    if d2t.dim() != 1 or t2d.dim() != 1:
        return f"d2t and t2d must be 1-D, got shapes {tuple(d2t.shape)} and {tuple(t2d.shape)}"
    if d2t.dtype != torch.int64:
        return f"d2t must be int64 offsets, got {d2t.dtype}"
    if t2d.dtype != torch.bool:
        return f"t2d must be a bool mask, got {t2d.dtype}"
    n_true = int(t2d.sum())
    if n_true != d2t.numel():
        return f"t2d marks {n_true} target ids but d2t has {d2t.numel()} draft ids"
    wanted = torch.nonzero(t2d).flatten().to(d2t.device)  # (Vd,) ascending
    got = draft_to_target_ids(d2t)
    if torch.equal(got, wanted):
        return None
    arange = torch.arange(d2t.numel(), device=d2t.device)
    if not d2t.any():
        return (
            "d2t is all zeros: every draft id i would map to target id i (the first "
            f"{d2t.numel()} ids), not to the t2d tokens; store offsets target_id - draft_id"
        )
    if torch.equal(d2t, arange):
        return (
            "d2t is arange(draft_vocab_size) instead of offsets (target_id = draft_id + "
            "d2t[draft_id]): store target_ids - arange"
        )
    if torch.equal(d2t, wanted):
        return (
            "d2t holds the target ids themselves instead of offsets (target_id = draft_id + "
            "d2t[draft_id]): store target_ids - arange"
        )
    bad = int((got != wanted).nonzero()[0])
    return (
        f"d2t does not match t2d: draft id {bad} maps to target id {int(got[bad])} but the "
        f"{bad}-th t2d token (ascending) is {int(wanted[bad])}"
    )
