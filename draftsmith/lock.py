"""One draftsmith command per run directory at a time: an OS file lock that dies with its process.

`fcntl.flock` on `<output_dir>/draftsmith.lock`: the kernel drops the lock when the
holder exits, however it exits (kill -9 included), so there is never a stale lock to
clean up. The holder writes its pid into the file, so a second command can say who
holds it. The file itself stays (deleting it would let two processes lock two
different files of the same name).

Under `accelerate launch` every rank runs the CLI; only global rank 0 locks, the
other ranks are the same job.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from draftsmith.errors import DraftsmithError

LOCK_FILE = "draftsmith.lock"


def is_main_rank() -> bool:
    """False on the non-zero ranks of a distributed launch (torchrun / accelerate set RANK)."""
    return os.environ.get("RANK", "0") == "0"


def lock_holder(lock_path: Path) -> str:
    """What the lock file says about its holder (pid and command), for the error message."""
    try:
        text = lock_path.read_text().strip()
    except OSError:
        text = ""
    pid, _, command = text.partition("\n")
    if not pid.isdigit():
        return "another draftsmith process (pid not written yet)"
    return f"draftsmith pid {pid}" + (f" ({command})" if command else "")


@contextmanager
def run_lock(output_dir: Path) -> Iterator[Path]:
    """Hold the run directory's lock for the duration of the block; busy: one clear error.

    `output_dir` must exist. An unwritable directory is an error naming run.output_dir.
    """
    path = Path(output_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise DraftsmithError(
            f"run.output_dir: cannot write in {output_dir} ({e.strerror}); choose a writable "
            "directory"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DraftsmithError(
                f"{output_dir}: in use by {lock_holder(path)}; wait for it to finish (or stop "
                "it), or use another run.output_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n{' '.join(sys.argv)}\n".encode())
        yield path
    finally:
        os.close(fd)  # closing the last descriptor releases the flock
