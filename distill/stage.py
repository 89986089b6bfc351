"""The distill stage entry point: train the draft into <output_dir>/checkpoints/."""

from __future__ import annotations

from pathlib import Path

from draftsmith.config import Config
from draftsmith.distill.checkpoint import (
    check_training_settings,
    find_resume,
    list_checkpoints,
    training_settings,
    verify_checkpoint,
)
from draftsmith.distill.train import train_draft


def _drafts(cfg: Config) -> list[tuple[Path, str]]:
    """(checkpoints dir, loss) of every draft this config trains."""
    out = [(cfg.output_dir / "checkpoints", cfg.distill.loss)]
    if cfg.distill.ce_baseline and cfg.distill.loss != "ce":
        out.append((cfg.output_dir / "ablations" / "ce", "ce"))
    return out


def check_distill_settings(cfg: Config) -> None:
    """Before any work: the checkpoints on disk were trained with this config's settings,
    and a finished draft's final checkpoint is readable (it will not be trained again)."""
    for directory, loss in _drafts(cfg):
        if cfg.distill.resume == "never":
            find_resume(directory, "never")  # checkpoints on disk are an error of their own
        check_training_settings(directory, training_settings(cfg, loss))
        done = dict(list_checkpoints(directory)).get(cfg.distill.max_steps)
        if done is not None:
            verify_checkpoint(done)


def run_distill(cfg: Config) -> None:
    """Distill the draft per cfg.distill/cfg.draft; resumable, a no-op when finished.

    With distill.ce_baseline, also train a plain cross-entropy twin (same data, steps
    and init) into <output_dir>/ablations/ce/ for the leaderboard's comparison.
    """
    check_distill_settings(cfg)
    train_draft(cfg, cfg.output_dir / "checkpoints")
    if cfg.distill.ce_baseline and cfg.distill.loss != "ce":
        train_draft(cfg, cfg.output_dir / "ablations" / "ce", loss_override="ce")
