"""The run directory as a whole: what lives in it, how records point into it, who may write it.

- Paths a stage records (leaderboard rows, the export's source) are relative to the run
  directory, so `cp -a` or `mv` of a run keeps every record pointing at its own files.
- `open_run_dir` creates the directory, takes its lock (draftsmith/lock.py), removes the
  temp files of killed commands and, when the command fails before writing anything,
  removes what it created: a failed command leaves no empty run directory behind.
- `record_config` writes the resolved config.yaml once a stage has passed its own checks
  and is about to write its results, never before: a command that fails its checks
  leaves the previous config.yaml as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from draftsmith.config import Config, dump_config, save_resolved_config
from draftsmith.errors import DraftsmithError
from draftsmith.io import clean_stale_temps
from draftsmith.lock import LOCK_FILE, is_main_rank, run_lock

# What stages write under <output_dir>/: nothing may be exported into (or over) them.
STAGE_DIRS = ("data", "checkpoints", "eval", "ablations", "wandb")


# ----------------------------------------------------------------------------- paths


def run_relative(path: str | Path, run_dir: str | Path) -> str:
    """`path` relative to the run directory when it lies inside it, else absolute."""
    full, root = Path(path).resolve(), Path(run_dir).resolve()
    if full == root or root in full.parents:
        return full.relative_to(root).as_posix()
    return str(full)


def from_run(ref: str | Path, run_dir: str | Path) -> Path:
    """A recorded path back on disk: relative ones are under the run directory."""
    path = Path(ref).expanduser()
    return path if path.is_absolute() else Path(run_dir) / path


def is_inside(path: Path, other: Path) -> bool:
    """True when `path` is `other` or lies below it (both resolved)."""
    path, other = Path(path).resolve(), Path(other).resolve()
    return path == other or other in path.parents


# ----------------------------------------------------------------------------- records


def flatten(d: dict, prefix: str = "") -> dict:
    """{"distill": {"lr": 1}} -> {"distill.lr": 1}: settings compared key by key."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def differing_keys(old: dict, new: dict) -> list[str]:
    """The dotted keys whose values differ between two nested settings dicts."""
    a, b = flatten(old), flatten(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


_recorded: dict[Path, str] = {}


def record_config(cfg: Config) -> None:
    """Write <output_dir>/config.yaml (once per process and config).

    Stages call this after their own consistency checks, right before their first write.
    """
    if not is_main_rank():
        return
    key, text = cfg.output_dir.resolve(), dump_config(cfg)
    if _recorded.get(key) == text:
        return
    save_resolved_config(cfg)
    _recorded[key] = text


# ----------------------------------------------------------------------------- the directory


def _missing_ancestors(path: Path) -> list[Path]:
    """`path` and its ancestors that do not exist yet, deepest first."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def make_dir(path: Path, key: str) -> None:
    """mkdir -p, or one line naming `key` when the path cannot be a directory."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DraftsmithError(f"{key}: {path} exists and is not a directory") from None
    except OSError as e:
        raise DraftsmithError(
            f"{key}: cannot create {path} ({e.strerror}); choose a writable directory"
        ) from None


def _remove_untouched(created: list[Path]) -> None:
    """Remove the directories this command created, if nothing but the lock file is in them."""
    out = created[0]
    if set(os.listdir(out)) - {LOCK_FILE}:
        return
    (out / LOCK_FILE).unlink(missing_ok=True)
    for p in created:
        try:
            p.rmdir()
        except OSError:
            return


@contextmanager
def open_run_dir(cfg: Config) -> Iterator[Path]:
    """Create the run directory, hold its lock, and remove it again if the command fails
    before anything was written."""
    out = cfg.output_dir
    created = _missing_ancestors(out.absolute())
    make_dir(out, "run.output_dir")
    if not is_main_rank():  # the other ranks of a distributed launch: rank 0 holds the lock
        yield out
        return
    with run_lock(out):
        for d in (out, out / "data"):  # config.yaml, meta.json, dataset/: their stages' temps
            clean_stale_temps(d)  # (checkpoints/, eval/ and shards/ are cleaned by theirs)
        try:
            yield out
        except BaseException:
            if created:
                _remove_untouched(created)
            raise
