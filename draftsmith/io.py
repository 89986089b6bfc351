"""Atomic writes: a reader (or a rerun after a crash) sees the old state or the new, never half.

Files are written to a temp sibling `<name>.tmp-<pid>-<random>` and `os.replace`d;
directories are built under `<name>.tmp-<pid>` and renamed into place. Every temp
name carries its writer's pid, so `clean_stale_temps` removes what a killed process
left and never what a live one is still writing.

Readers of run files go through `checked_read_json` / `checked_read_jsonl`: a missing,
truncated or foreign file is one line naming the file and what to do, not a traceback.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from draftsmith.errors import DraftsmithError

TMP_MARK = ".tmp-"
# Crash tests set this to a tag ("step:3", "evaluate:checkpoint-3:k4", ...) and the process
# SIGKILLs itself where kill_hook(tag) is reached, so resumption is tested at real crash points.
KILL_ENV = "DRAFTSMITH_TEST_KILL"


def kill_hook(tag: str) -> None:
    if os.environ.get(KILL_ENV) == tag:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


# How libraries report a full disk when they do not raise OSError(ENOSPC): safetensors'
# Rust IoError, and torch.save's zip writer, whose RuntimeError names no errno at all.
_FULL_DISK_WORDS = ("No space left", "StorageFull", "code: 28")
_ZIP_WRITER_WORDS = ("unexpected pos", "PytorchStreamWriter failed")
_NEARLY_FULL = 16 << 20  # bytes free under which a zip-writer failure is read as a full disk


def _free_bytes(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _is_full_disk(e: BaseException, path: Path) -> bool:
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(e)
    if any(w in text for w in _FULL_DISK_WORDS):
        return True
    return any(w in text for w in _ZIP_WRITER_WORDS) and _free_bytes(path) < _NEARLY_FULL


@contextmanager
def named_write_errors(path: str | Path) -> Iterator[None]:
    """Re-raise a failed write as OSError naming `path`, so the CLI prints one line.

    A full disk surfaces as OSError without a filename (file.write, savefig), as a
    RuntimeError (torch.save) or as a library error (safetensors); each becomes
    `OSError(ENOSPC, ..., path)`, which the CLI reports as `PATH: No space left on device`.
    """
    path = Path(path)
    try:
        yield
    except OSError as e:
        if e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    except Exception as e:
        if _is_full_disk(e, path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    with named_write_errors(path):
        _atomic_write_text(path, text)


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}{TMP_MARK}{os.getpid()}-")
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
        with named_write_errors(path):
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


# `<name>.tmp-<pid>`, `<name>.tmp-<pid>-<random>` (files) or `<name>.tmp-old-<pid>`
_TMP_PID = re.compile(r"\.tmp-(?:old-)?(\d+)(?:-|$)")


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (signal 0 probes without signalling)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    except OverflowError:
        return False
    return True


def temp_owner(name: str) -> int | None:
    """The pid a temp name was written by, or None for a name without one."""
    m = _TMP_PID.search(name)
    return int(m.group(1)) if m else None


def clean_stale_temps(directory: str | Path, prefix: str = "") -> None:
    """Remove temp files/dirs that killed processes left in `directory`.

    Only names starting with `prefix` are touched (export cleans `<export>.tmp-*` in a
    folder that is not draftsmith's). A temp whose writer is still running stays: a
    second process must not delete the first one's half-built output. A temp name
    without a pid (written by an older draftsmith) counts as stale.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    for p in directory.iterdir():
        if not p.name.startswith(prefix) or TMP_MARK not in p.name:
            continue
        owner = temp_owner(p.name)
        if owner is not None and (owner == os.getpid() or pid_alive(owner)):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- checked reads


def corrupt_file(path: str | Path, what: str, fix: str) -> DraftsmithError:
    """The one-line error for a run file that is missing, truncated or foreign."""
    return DraftsmithError(f"{path}: {what}; {fix}")


def checked_read_text(path: str | Path, fix: str) -> str:
    """A UTF-8 text file, or one line naming the file and `fix` (what the user should do)."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise corrupt_file(path, "missing", fix) from None
    except IsADirectoryError:
        raise corrupt_file(path, "is a directory, not a file", fix) from None
    except UnicodeDecodeError as e:
        raise corrupt_file(path, f"not UTF-8 text (byte {e.start})", fix) from None
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise corrupt_file(path, f"cannot be read ({e.strerror})", fix) from None
        raise


def checked_read_json(path: str | Path, fix: str) -> Any:
    """A JSON file written by a stage; missing, truncated or not JSON: one line with `fix`."""
    text = checked_read_text(path, fix)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        what = "empty" if not text.strip() else f"truncated or not JSON ({e.msg}, line {e.lineno})"
        raise corrupt_file(path, what, fix) from None


def checked_read_jsonl(path: str | Path, fix: str) -> list[Any]:
    """A JSON-lines file written by a stage, one record a line; a bad line: one line with `fix`."""
    records = []
    for i, line in enumerate(checked_read_text(path, fix).splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise corrupt_file(path, f"line {i} is truncated or not JSON ({e.msg})", fix) from None
    return records


# ------------------------------------------------------------------------ settings-keyed caches


def load_cached(path: Path, settings: dict) -> dict | None:
    """The JSON at `path` when it was made under `settings` (its "settings" key), else None
    (missing, unreadable or made under others)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return data if data.get("settings") == settings else None


def cached_json(path: Path, settings: dict, make) -> dict:
    """The file's data when its settings match, else make() written there (atomically)."""
    hit = load_cached(path, settings)
    if hit is not None:
        return hit
    data = {"settings": settings, **make()}
    atomic_write_json(path, data)
    return data
