"""Generate: run the target over prompt sets and store its outputs."""

from __future__ import annotations

import json
from pathlib import Path

from draftsmith.errors import DraftsmithError

__all__ = ["HELDOUT", "load_eval_prompts", "load_train_dataset"]

# The eval set of the held-out split of role=both sources (each role=eval source is a set
# named after it); also the set of eval prompts written before eval sets existed.
HELDOUT = "heldout"


def _need(path: Path) -> Path:
    if not path.exists():
        raise DraftsmithError(f"{path}: not found; run `draftsmith generate CONFIG` first")
    return path


def load_train_dataset(output_dir: str | Path):
    """The finished training data: `datasets.load_from_disk(<output_dir>/data/dataset)`."""
    import datasets

    path = _need(Path(output_dir) / "data" / "dataset")
    _need(Path(output_dir) / "data" / "meta.json")  # written last: the dataset is complete
    return datasets.load_from_disk(str(path))


def load_eval_prompts(output_dir: str | Path) -> list[dict]:
    """The held-out prompts: [{"id", "prompt_text", "prompt_ids", "category", "source",
    "eval_set", "messages", "followups"}, ...] (runs generated before eval sets lack the last
    three)."""
    path = _need(Path(output_dir) / "data" / "eval_prompts.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
