"""Generate: run the target over prompt sets and store its outputs."""

from __future__ import annotations

from pathlib import Path

from draftsmith.errors import DraftsmithError
from draftsmith.io import checked_read_json, checked_read_jsonl, corrupt_file

__all__ = [
    "EVAL_PROMPT_KEYS",
    "HELDOUT",
    "load_data_meta",
    "load_eval_prompts",
    "load_train_dataset",
]

# The eval set of the held-out split of role=both sources (each role=eval source is a set
# named after it).
HELDOUT = "heldout"


def _need(path: Path) -> Path:
    if not path.exists():
        raise DraftsmithError(f"{path}: not found; run `draftsmith generate CONFIG` first")
    return path


def regenerate_hint(output_dir: str | Path) -> str:
    """What to do about a damaged file of the finished data: make the data again."""
    return f"delete {Path(output_dir) / 'data'} and rerun `draftsmith generate CONFIG`"


def load_data_meta(output_dir: str | Path) -> dict:
    """<output_dir>/data/meta.json (generate's record of what it made and with what settings)."""
    path = Path(output_dir) / "data" / "meta.json"
    meta = checked_read_json(path, regenerate_hint(output_dir))
    if not isinstance(meta, dict):
        raise corrupt_file(path, "not generate's record", regenerate_hint(output_dir))
    return meta


def load_train_dataset(output_dir: str | Path):
    """The finished training data: `datasets.load_from_disk(<output_dir>/data/dataset)`.

    A truncated or foreign arrow file, or a row count other than meta.json's, is one line
    saying to make the data again.
    """
    import datasets

    path = _need(Path(output_dir) / "data" / "dataset")
    _need(Path(output_dir) / "data" / "meta.json")  # written last: the dataset is complete
    meta = load_data_meta(output_dir)
    try:
        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as e:  # pyarrow: OSError or ArrowInvalid (a ValueError)
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise corrupt_file(path, f"unreadable ({detail})", regenerate_hint(output_dir)) from None
    want = meta.get("num_completions")
    if want is not None and len(ds) != want:
        raise corrupt_file(
            path, f"holds {len(ds)} rows, meta.json says {want}", regenerate_hint(output_dir)
        )
    return ds


# What generate writes for every held-out prompt (data/generate.py eval_records).
EVAL_PROMPT_KEYS = (
    "id", "prompt_text", "prompt_ids", "category", "source", "eval_set", "messages", "followups"
)  # fmt: skip


def load_eval_prompts(output_dir: str | Path) -> list[dict]:
    """The held-out prompts: [{EVAL_PROMPT_KEYS}, ...], each key present (a line without one
    is named as a damaged file)."""
    path = _need(Path(output_dir) / "data" / "eval_prompts.jsonl")
    prompts = checked_read_jsonl(path, regenerate_hint(output_dir))
    for i, p in enumerate(prompts, 1):
        if not isinstance(p, dict):
            raise corrupt_file(path, f"line {i} is not a JSON object", regenerate_hint(output_dir))
        missing = [k for k in EVAL_PROMPT_KEYS if k not in p]
        if missing:
            raise corrupt_file(path, f"line {i} has no {missing[0]!r}", regenerate_hint(output_dir))
    return prompts
