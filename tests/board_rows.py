"""Leaderboard rows for tests that build them by hand: the identity and settings fields a
row must have, filled in, so each test states only the figures it is about."""

from __future__ import annotations

from draftsmith.evaluate.records import LeaderboardRow


def make_row(checkpoint: str, **fields) -> LeaderboardRow:
    """A native greedy engine row of draft `checkpoint` on the heldout set at k=4; its step
    (and trained_steps) from a `checkpoint-<step>` name, else None; `fields` override."""
    step = int(checkpoint.split("-")[1]) if checkpoint.startswith("checkpoint-") else None
    defaults = {
        "checkpoint": checkpoint,
        "path": f"checkpoints/{checkpoint}",
        "step": step,
        "role": "distilled",
        "kind": "independent",
        "trained_steps": step,
        "eval_set": "heldout",
        "measured_by": "engine",
        "num_speculative_tokens": 4,
        "temperature": 0.0,
        "backend": "native",
    }
    return LeaderboardRow(**(defaults | fields))


# vLLM's speculative-decoding counters for 10 rounds of k=3 (what vllm_backend reads from
# its metrics): 30 drafts proposed, 15 accepted, 8 / 5 / 2 at positions 1 / 2 / 3.
VLLM_COUNTS = {
    "num_drafts": 10,
    "num_draft_tokens": 30,
    "num_accepted_tokens": 15,
    "accepted_per_pos": [8, 5, 2],
}
