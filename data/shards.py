"""Resumable output: shards of `data.shard_size` prompts, each written atomically.

    <out>/data/shards/plan.json          the settings fingerprint + every shard's prompt ids
    <out>/data/shards/shard-00003/       complete iff this name exists (temp dir, then rename)
        dataset/                         the shard's rows (datasets.save_to_disk)
        shard.json                       its counts and generation wall time

A rerun skips every finished shard. A killed run leaves at most a
`shard-XXXXX.tmp-<pid>` dir, which the next run deletes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import datasets

from draftsmith.errors import DraftsmithError
from draftsmith.io import atomic_dir, atomic_write_json, clean_stale_temps


def features(topk: bool) -> datasets.Features:
    cols = {
        "prompt_id": datasets.Value("string"),
        "prompt_ids": datasets.Sequence(datasets.Value("int32")),
        "completion_ids": datasets.Sequence(datasets.Value("int32")),
        "prompt_text": datasets.Value("string"),
        "completion_text": datasets.Value("string"),
        "category": datasets.Value("string"),
        "source": datasets.Value("string"),
        "split": datasets.Value("string"),
        "sample_index": datasets.Value("int32"),
        "finish_reason": datasets.Value("string"),
        "kind": datasets.Value("string"),  # "target" (written by it) or "score" (scored by it)
    }
    if topk:
        cols["topk_ids"] = datasets.Sequence(datasets.Sequence(datasets.Value("int32")))
        cols["topk_logprobs"] = datasets.Sequence(datasets.Sequence(datasets.Value("float32")))
    return datasets.Features(cols)


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """No per-save progress bars from `datasets` (generate has its own bar)."""
    was_on = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            datasets.enable_progress_bars()


def shards_dir(data_dir: Path) -> Path:
    return data_dir / "shards"


def shard_path(data_dir: Path, i: int) -> Path:
    return shards_dir(data_dir) / f"shard-{i:05d}"


def prepare(data_dir: Path, plan: dict) -> None:
    """Start or resume: the saved plan must equal this one (same prompts, same settings)."""
    root = shards_dir(data_dir)
    clean_stale_temps(root)
    plan_file = root / "plan.json"
    if plan_file.is_file():
        old = json.loads(plan_file.read_text())
        if old != plan:
            changed = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
            raise DraftsmithError(
                f"{root}: unfinished shards were made with other settings ({', '.join(changed)} "
                "differ); delete that dir or use a new run.output_dir"
            )
        return
    atomic_write_json(plan_file, plan)


def is_done(data_dir: Path, i: int) -> bool:
    return (shard_path(data_dir, i) / "shard.json").is_file()


def write_shard(data_dir: Path, i: int, rows: dict[str, list], info: dict, topk: bool) -> None:
    with quiet_datasets(), atomic_dir(shard_path(data_dir, i), overwrite=True) as tmp:
        datasets.Dataset.from_dict(rows, features=features(topk)).save_to_disk(str(tmp / "dataset"))
        (tmp / "shard.json").write_text(json.dumps(info, indent=2) + "\n")


def read_shard_info(data_dir: Path, i: int) -> dict:
    return json.loads((shard_path(data_dir, i) / "shard.json").read_text())


def concat_shards(data_dir: Path, num_shards: int) -> datasets.Dataset:
    parts = [
        datasets.load_from_disk(str(shard_path(data_dir, i) / "dataset")) for i in range(num_shards)
    ]
    return datasets.concatenate_datasets(parts)
