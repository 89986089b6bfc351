"""Distill: KL-family losses, draft initialisation and the accelerate training loop."""
