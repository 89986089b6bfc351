"""Resumable output: shards of `data.shard_size` prompts, each written atomically.

    <out>/data/shards/plan.json          the settings fingerprint + every shard's prompt ids
    <out>/data/shards/shard-00003/       complete iff this name exists (temp dir, then rename)
        dataset/                         the shard's rows (datasets.save_to_disk)
        shard.json                       its counts, generation wall time, row count and
                                         the sha256 of every file under dataset/

A rerun skips every finished shard whose files still match their sha256 (`is_done`);
a shard damaged since (a truncated arrow file, a broken shard.json) is deleted and
generated again. A killed run leaves at most a `shard-XXXXX.tmp-<pid>` dir, which
the next run deletes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import datasets

from draftsmith.errors import DraftsmithError
from draftsmith.io import atomic_dir, atomic_write_json, checked_read_json, clean_stale_temps


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
        old = checked_read_json(plan_file, f"delete {root} and rerun `draftsmith generate CONFIG`")
        if old != plan:
            changed = sorted(k for k in set(old) | set(plan) if old.get(k) != plan.get(k))
            raise DraftsmithError(
                f"{root}: unfinished shards were made with other settings ({', '.join(changed)} "
                "differ); delete that dir or use a new run.output_dir"
            )
        return
    atomic_write_json(plan_file, plan)


def file_digests(directory: Path) -> dict[str, str]:
    """sha256 of every file below `directory`, by relative path."""
    return {
        f.relative_to(directory).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(directory.rglob("*"))
        if f.is_file()
    }


def shard_problem(path: Path) -> str | None:
    """Why a finished shard cannot be used (None: it is whole)."""
    try:
        info = json.loads((path / "shard.json").read_text())
    except (OSError, ValueError):
        return "shard.json is truncated or unreadable"
    if not isinstance(info, dict) or "files" not in info:
        return "shard.json holds no sha256 of its files"
    if file_digests(path / "dataset") != info["files"]:
        return "its files differ from the sha256 in shard.json (truncated or changed)"
    return None


def is_done(data_dir: Path, i: int) -> bool:
    """True for a finished, whole shard; a damaged one is deleted so it is generated again."""
    path = shard_path(data_dir, i)
    if not (path / "shard.json").is_file():
        return False
    problem = shard_problem(path)
    if problem is None:
        return True
    print(f"generate: {path.name} is damaged ({problem}); generating it again")
    shutil.rmtree(path)
    return False


def write_shard(data_dir: Path, i: int, rows: dict[str, list], info: dict, topk: bool) -> None:
    with quiet_datasets(), atomic_dir(shard_path(data_dir, i), overwrite=True) as tmp:
        ds = datasets.Dataset.from_dict(rows, features=features(topk))
        ds.save_to_disk(str(tmp / "dataset"))
        info = {**info, "rows": len(ds), "files": file_digests(tmp / "dataset")}
        (tmp / "shard.json").write_text(json.dumps(info, indent=2) + "\n")


def read_shard_info(data_dir: Path, i: int) -> dict:
    return json.loads((shard_path(data_dir, i) / "shard.json").read_text())


def concat_shards(data_dir: Path, num_shards: int) -> datasets.Dataset:
    parts = [
        datasets.load_from_disk(str(shard_path(data_dir, i) / "dataset")) for i in range(num_shards)
    ]
    return datasets.concatenate_datasets(parts)
