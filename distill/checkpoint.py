"""Checkpoints: `checkpoints/checkpoint-<step>/`, each a loadable HF model dir plus train state.

Layout of one checkpoint (the stage contract):
    the model files of its kind, as that kind's training side writes and reads them
    (KindTraining in draftsmith/kinds/base.py; each kind's folder says its layout)
    train_state.pt               optimizer, scheduler, RNG, step and loss history
                                 (tensors and plain Python only: torch.load(weights_only=True))
    draftsmith_checkpoint.json   {"step", "kind", "loss", "init", "loss_name", "teacher", ...,
                                  "settings": what it was trained with (training_settings)}

A checkpoint is complete iff its final directory name exists: it is written under
a temp name and renamed (draftsmith.io.atomic_dir), so a run killed mid-write
leaves only a temp dir that the next run deletes.

Resume policy (distill.resume):
    auto    continue from the newest complete checkpoint (start fresh when there is none);
    never   always start fresh; an error if the directory already holds checkpoints
            (delete them, or use auto), so nothing is silently overwritten;
    <path>  continue from that checkpoint dir (new checkpoints still go to checkpoints/).

Every checkpoint records the settings that change training (`training_settings`); a
rerun whose settings differ from those on disk is one error naming the keys
(`check_training_settings`), and the model card and leaderboard read a draft's
training from its own record, never from the current config. A checkpoint to resume
from is checked first (`verify_checkpoint`): a truncated file is one line saying
which file and what to do.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
import shutil
from pathlib import Path

import torch

from draftsmith.config import Config
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.integrity import check_weight_files, checkpoint_hint
from draftsmith.io import (  # noqa: F401 (KILL_ENV, kill_hook: re-exported)
    KILL_ENV,
    atomic_dir,
    checked_read_json,
    corrupt_file,
    kill_hook,
)

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


def redo_hint(path: Path) -> str:
    """What to do about a broken checkpoint (integrity.checkpoint_hint: one wording)."""
    return checkpoint_hint(path)


def load_train_state(path: Path) -> dict:
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise DraftsmithError(
            f"distill.resume: {path} has no {STATE_FILE}; not a distill checkpoint"
        )
    try:
        return torch.load(state_file, weights_only=True, map_location="cpu")
    except (RuntimeError, EOFError, pickle.UnpicklingError, OSError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise corrupt_file(
            state_file, f"truncated or corrupt ({detail})", redo_hint(path)
        ) from None


# What every record distill writes holds; the readers index these without a fallback.
META_KEYS = ("step", "kind", "init", "loss_name", "settings")


def read_meta(path: Path) -> dict:
    meta = checked_read_json(Path(path) / META_FILE, redo_hint(path))
    if not isinstance(meta, dict):
        raise corrupt_file(Path(path) / META_FILE, "not a checkpoint record", redo_hint(path))
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise corrupt_file(
            Path(path) / META_FILE, f"a checkpoint record without {missing[0]!r}", redo_hint(path)
        )
    return meta


def verify_checkpoint(path: Path) -> None:
    """A checkpoint to resume from, checked before any work: its record and its weight files
    (complete, not truncated). Its train state is checked when it is loaded."""
    read_meta(path)
    check_weight_files(path)


# ----------------------------------------------------------------------------- training settings

# distill keys that do not change the weights: where and how often checkpoints are written,
# logging, how to resume, and whether a CE twin is trained beside the draft.
BOOKKEEPING = ("save_every", "save_steps", "keep_last", "log_every", "resume", "ce_baseline")


def training_settings(cfg: Config, loss_name: str, kind) -> dict:
    """Every setting that changes what training produces, by config section.

    `kind`: the kind's training side (DraftKind.training(): draftsmith/kinds/); the draft
    section holds its name and the keys that kind reads, so adding a kind to draft.kind, or
    changing another kind's keys, leaves it untouched.
    """
    distill = dataclasses.asdict(cfg.distill)
    for key in BOOKKEEPING:
        distill.pop(key)
    distill["loss"] = loss_name  # the CE twin trains with "ce" under the same config
    target = dataclasses.asdict(cfg.target)
    target.pop("trust_remote_code")
    return {
        "run": {"seed": cfg.run.seed},
        "target": target,
        "draft": {"kind": kind.name, **kind.draft_settings(cfg)},
        "distill": distill,
    }


def check_training_settings(directory: Path, settings: dict) -> None:
    """Every checkpoint in `directory` must have been trained with `settings`.

    Otherwise "already finished" would keep a draft trained with other settings and
    the card would describe it with the new ones, or training would go on from weights
    made with the old ones.
    """
    from draftsmith.rundir import differing_keys

    for _, path in list_checkpoints(directory):
        recorded = read_meta(path)["settings"]
        keys = differing_keys(recorded, settings)
        if keys:
            old, new = _values(recorded, keys[0]), _values(settings, keys[0])
            raise DraftsmithError(
                f"{directory}: its checkpoints were trained with other settings ({', '.join(keys)} "
                f"differ; e.g. {keys[0]} was {old!r}, now {new!r}); put the settings back, or "
                "delete that dir (or use a new run.output_dir) to train with these"
            )


def _values(settings: dict, key: str):
    from draftsmith.rundir import flatten

    return flatten(settings).get(key)


def prune_checkpoints(directory: Path, keep_last: int | None) -> None:
    """Keep the newest `keep_last` checkpoints (checkpoint-0, the init, is never deleted)."""
    if keep_last is None:
        return
    trained = [(s, p) for s, p in list_checkpoints(directory) if s > 0]
    for _, p in trained[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)


def find_resume(directory: Path, resume: str) -> Path | None:
    """The checkpoint to continue from per distill.resume (verified), or None to start fresh."""
    found = list_checkpoints(directory)
    if resume == "auto":
        if found:
            verify_checkpoint(found[-1][1])
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
    verify_checkpoint(path)
    return path
