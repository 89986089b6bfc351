"""The distill stage entry point: train the draft into <output_dir>/checkpoints/."""

from __future__ import annotations

from draftsmith.config import Config
from draftsmith.distill.train import train_draft


def run_distill(cfg: Config) -> None:
    """Distill the draft per cfg.distill/cfg.draft; resumable, a no-op when finished.

    With distill.ce_baseline, also train a plain cross-entropy twin (same data, steps
    and init) into <output_dir>/ablations/ce/ for the leaderboard's comparison.
    """
    train_draft(cfg, cfg.output_dir / "checkpoints")
    if cfg.distill.ce_baseline and cfg.distill.loss != "ce":
        train_draft(cfg, cfg.output_dir / "ablations" / "ce", loss_override="ce")
