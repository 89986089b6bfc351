"""The eagle3 kind's config section, `draft.eagle3` (Eagle3Kind.config_section: the registry
makes it a key of draftsmith/config.py's draft section)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from draftsmith.schema import bounds

if TYPE_CHECKING:
    from draftsmith.config import Config


@dataclass
class Eagle3Config:
    """draft.eagle3: what only the eagle3 kind has, a head on the target's own hidden states
    (head.py here). Read only when draft.kind names eagle3 (Eagle3Kind.check_config)."""

    # The target layers whose input hidden states the head reads: 3 distinct ids, low to
    # high. null: (2, n // 2, n - 3) for an n-layer target, as vLLM and speculators choose
    # (it needs n >= 7: a 4-layer test target must list them, e.g. [1, 2, 3]).
    aux_layer_ids: list[int] | None = None
    # The head predicts only the target's draft_vocab_size most frequent tokens in the
    # training data (draftsmith/kinds/eagle3/vocab.py); the default was chosen by measurement
    # (README, "Choosing the head's defaults").
    draft_vocab_size: int = field(default=8192, metadata=bounds(ge=1))
    # Training-time test: drafting steps unrolled per position, step j reading the head's
    # own state of step j-1 (speculators' default 3). The loss sums the steps' token
    # means, step j weighted ttt_loss_decay**j (1: speculators' equal weights; the default
    # by measurement, README "Choosing the head's defaults").
    ttt_steps: int = field(default=3, metadata=bounds(ge=1))
    ttt_loss_decay: float = field(default=0.5, metadata=bounds(gt=0, le=1))
    # Residual from the normalised feature (true) or the raw one (false); vLLM reads a
    # missing key as true and speculators as false, so the export always writes it.
    norm_before_residual: bool = False
    # Start lm_head from the target's output rows of the draft vocabulary (as speculators
    # does), and whether it trains (false: only fc, the layer and the norm do).
    lm_head_from_target: bool = True
    train_lm_head: bool = True
    # The head's own learning rate (null: distill.lr). A head trained from scratch wants a
    # far larger step than a pretrained independent draft being fine-tuned in the same run.
    lr: float | None = field(default=None, metadata=bounds(gt=0))
    # Export the target's token embeddings with the head: speculators 0.9 does not reliably
    # fill missing ones (draftsmith/kinds/eagle3/export.py); vLLM shares the target's either way.
    include_embeddings: bool = True


def eagle3_settings(cfg: Config) -> Eagle3Config:
    """draft.eagle3 of a loaded config."""
    return cfg.draft.section("eagle3")
