"""Evaluate: a real speculative decoder, acceptance metrics and checkpoint ranking."""
