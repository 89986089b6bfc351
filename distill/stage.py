"""The distill stage entry point: train the draft into <output_dir>/checkpoints/."""

from __future__ import annotations

from draftsmith.config import Config
from draftsmith.distill.train import train_draft


def run_distill(cfg: Config) -> None:
    """Distill the draft per cfg.distill/cfg.draft; resumable, a no-op when finished."""
    train_draft(cfg, cfg.output_dir / "checkpoints")
