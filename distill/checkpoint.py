"""Checkpoints: `checkpoints/checkpoint-<step>/`, each a loadable HF model dir plus train state.

Layout of one checkpoint (the stage contract):
    the model files of its kind (draftsmith/kinds.py): an independent draft's HF model dir
    (model.safetensors, config.json, generation_config.json, tokenizer files), an eagle3
    head's speculators layout (config.json, model.safetensors; the target's embeddings
    are not copied)
    train_state.pt               optimizer, scheduler, RNG, step and loss history
                                 (tensors and plain Python only: torch.load(weights_only=True))
    draftsmith_checkpoint.json   {"step", "kind", "loss", "init", "loss_name", "teacher", ...}

A checkpoint is complete iff its final directory name exists: it is written under
a temp name and renamed (draftsmith.io.atomic_dir), so a run killed mid-write
leaves only a temp dir that the next run deletes.

Resume policy (distill.resume):
    auto    continue from the newest complete checkpoint (start fresh when there is none);
    never   always start fresh; an error if the directory already holds checkpoints
            (delete them, or use auto), so nothing is silently overwritten;
    <path>  continue from that checkpoint dir (new checkpoints still go to checkpoints/).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.io import KILL_ENV, atomic_dir, kill_hook  # noqa: F401 (re-exported)

_NAME = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "train_state.pt"
META_FILE = "draftsmith_checkpoint.json"
# Test hook (draftsmith.io.kill_hook): "save:<step>" SIGKILLs this process in the middle of
# writing checkpoint-<step>, "step:<step>" right after optimizer step <step>.


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints in `directory` as (step, path), sorted by step."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def save_checkpoint(directory: Path, step: int, write_model, train_state: dict, meta: dict) -> Path:
    """Write checkpoint-<step> atomically (replacing an existing one of the same step).

    write_model(dir) writes the model files: its kind's (draftsmith.kinds model_writer).
    """
    path = Path(directory) / f"checkpoint-{step}"
    with atomic_dir(path, overwrite=True) as tmp:
        write_model(tmp)
        kill_hook(f"save:{step}")
        torch.save(train_state, tmp / STATE_FILE)
        (tmp / META_FILE).write_text(json.dumps({"step": step, **meta}, indent=2) + "\n")
    return path


def load_train_state(path: Path) -> dict:
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise DraftsmithError(
            f"distill.resume: {path} has no {STATE_FILE}; not a distill checkpoint"
        )
    return torch.load(state_file, weights_only=True, map_location="cpu")


def read_meta(path: Path) -> dict:
    return json.loads((Path(path) / META_FILE).read_text())


def prune_checkpoints(directory: Path, keep_last: int | None) -> None:
    """Keep the newest `keep_last` checkpoints (checkpoint-0, the init, is never deleted)."""
    if keep_last is None:
        return
    trained = [(s, p) for s, p in list_checkpoints(directory) if s > 0]
    for _, p in trained[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


def find_resume(directory: Path, resume: str) -> Path | None:
    """The checkpoint to continue from per distill.resume, or None to start fresh."""
    found = list_checkpoints(directory)
    if resume == "auto":
        return found[-1][1] if found else None
    if resume == "never":
        if found:
            raise DraftsmithError(
                f"distill.resume: 'never' but {directory} already holds checkpoints "
                f"(newest {found[-1][1].name}); delete them or use distill.resume=auto"
            )
        return None
    path = Path(resume).expanduser()
    if not (path / STATE_FILE).is_file():
        raise ConfigError(
            f"distill.resume: {resume} is not a checkpoint dir (expected auto, never or a "
            f"path holding {STATE_FILE})"
        )
    return path
