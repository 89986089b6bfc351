"""Atomic writes: a reader (or a rerun after a crash) sees the old state or the new, never half.

Files are written to a temp sibling and `os.replace`d; directories are built
under `<name>.tmp-<pid>` and renamed into place. Leftover temp dirs from a
killed run are removed by `clean_stale_temps`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TMP_MARK = ".tmp-"
# Crash tests set this to a tag ("step:3", "evaluate:checkpoint-3:k4", ...) and the process
# SIGKILLs itself where kill_hook(tag) is reached, so resumption is tested at real crash points.
KILL_ENV = "DRAFTSMITH_TEST_KILL"


def kill_hook(tag: str) -> None:
    if os.environ.get(KILL_ENV) == tag:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + TMP_MARK)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


@contextmanager
def atomic_dir(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temp dir; on success it replaces `path`, on error it is deleted.

    With overwrite=False an existing `path` is an error raised by the caller
    beforehand; here it is only replaced when overwrite=True.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{path.name}{TMP_MARK}{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        if path.exists():
            if not overwrite:
                raise FileExistsError(path)
            old = path.parent / f"{path.name}{TMP_MARK}old-{os.getpid()}"
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def clean_stale_temps(directory: str | Path) -> None:
    """Remove temp files/dirs a killed process left in `directory`."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        if TMP_MARK in p.name:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
