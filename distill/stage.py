"""The distill stage entry point: train each configured kind of draft into its checkpoints dir."""

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
from draftsmith.kinds import get_kind


def _drafts(cfg: Config) -> list[tuple[Path, str, object]]:
    """(checkpoints dir, loss, the kind's training side) of every draft this config trains:
    each kind in draft.kind, and with distill.ce_baseline its cross-entropy twin."""
    out = []
    for kind in map(get_kind, cfg.draft.kinds):
        out.append((kind.checkpoints_dir(cfg.output_dir), cfg.distill.loss, kind.training()))
        if cfg.distill.ce_baseline and cfg.distill.loss != "ce":
            out.append((kind.ce_dir(cfg.output_dir), "ce", kind.training()))
    return out


def check_distill_settings(cfg: Config) -> None:
    """Before any work: the checkpoints on disk were trained with this config's settings,
    and a finished draft's final checkpoint is readable (it will not be trained again)."""
    for directory, loss, training in _drafts(cfg):
        if cfg.distill.resume == "never":
            find_resume(directory, "never")  # checkpoints on disk are an error of their own
        check_training_settings(directory, training_settings(cfg, loss, training))
        done = dict(list_checkpoints(directory)).get(cfg.distill.max_steps)
        if done is not None:
            verify_checkpoint(done)


def run_distill(cfg: Config) -> None:
    """Distill each kind in draft.kind per cfg.distill/cfg.draft; resumable, a no-op when finished.

    Each kind trains into its own folder (DraftKind.checkpoints_dir: <its root>/checkpoints/,
    the root "" for the registry's fallback kind). With distill.ce_baseline, each
    also trains a plain cross-entropy twin (same data, steps and init) next to it, in
    ablations/ce/, for the leaderboard's comparison.
    """
    check_distill_settings(cfg)
    for directory, loss, training in _drafts(cfg):
        train_draft(cfg, directory, training, loss_override=loss)
