"""The distill stage entry point: train each configured kind of draft into its checkpoints dir."""

from __future__ import annotations

from draftsmith.config import Config
from draftsmith.distill.train import train_draft
from draftsmith.kinds import get_kind


def run_distill(cfg: Config) -> None:
    """Distill each kind in draft.kind per cfg.distill/cfg.draft; resumable, a no-op when finished.

    Each kind trains into its own folder (draftsmith/kinds.py: checkpoints/ for the
    independent draft, eagle3/checkpoints/ for the head). With distill.ce_baseline, each
    also trains a plain cross-entropy twin (same data, steps and init) next to it, in
    ablations/ce/, for the leaderboard's comparison.
    """
    for name in cfg.draft.kinds:
        kind = get_kind(name)
        train_draft(cfg, kind.checkpoints_dir(cfg.output_dir), kind=kind.training())
        if cfg.distill.ce_baseline and cfg.distill.loss != "ce":
            ce_dir = kind.ce_dir(cfg.output_dir)
            train_draft(cfg, ce_dir, loss_override="ce", kind=kind.training())
