"""Distill: KL-family losses, draft initialisation and the accelerate training loop."""

from draftsmith.distill.checkpoint import list_checkpoints

__all__ = ["list_checkpoints"]
