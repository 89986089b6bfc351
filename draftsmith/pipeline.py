"""The stage registry and `draftsmith run`: the four stages in order, each resuming from disk.

The CLI imports this module, never the reverse: which function runs a stage is the
pipeline's business, the CLI only parses arguments.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import time
from collections.abc import Callable

from draftsmith.config import Config


def stage_function(name: str) -> Callable[[Config], object]:
    """The entry point of stage `name` (generate, distill, evaluate, export or run)."""
    # Imported lazily: `draftsmith --help` must not pay for torch and transformers.
    if name == "generate":
        from draftsmith.data.generate import run_generate as fn
    elif name == "distill":
        from draftsmith.distill.stage import run_distill as fn
    elif name == "evaluate":
        from draftsmith.evaluate.stage import run_evaluate as fn
    elif name == "export":
        from draftsmith.export import run_export as fn
    elif name == "run":
        fn = run_pipeline
    else:
        raise ValueError(f"unknown stage {name!r}")  # the CLI's choices make this a bug
    return fn


def preflight(cfg: Config, stages: list[str]) -> None:
    """Each stage's cheap consistency checks, before any stage runs or writes.

    `draftsmith run` with a changed loss, or a target the configured kinds cannot be
    built on, fails here, not after generate has run; the
    stages repeat their own checks when called alone.
    """
    if "generate" in stages:
        from draftsmith.data.generate import finished_meta

        finished_meta(cfg, cfg.output_dir / "data")  # data made with other settings
    if "distill" in stages:
        from draftsmith.distill.stage import check_distill_settings
        from draftsmith.kinds import check_target
        from draftsmith.models import load_target_config, load_target_tokenizer

        check_distill_settings(cfg)  # checkpoints trained with other settings
        # each kind against the target's config and tokenizer (no weights): a target a
        # configured kind cannot be built on (or a pretrained draft of another family)
        # fails before generate runs
        check_target(cfg, load_target_config(cfg.target), load_target_tokenizer(cfg.target))
    if "export" in stages:
        from draftsmith.export import check_export_target

        check_export_target(cfg)  # the run dir, a stage dir, or something not an export


def _already_exported(cfg: Config) -> bool:
    """True when export/ holds the leaderboard's current choice, made at its current place."""
    from draftsmith.export import export_dir, read_export_marker, read_leaderboard

    out = export_dir(cfg)
    board_path = cfg.output_dir / "eval" / "leaderboard.json"
    marker = read_export_marker(out)
    if marker is None or not board_path.is_file():
        return False
    wanted = cfg.export.checkpoint or read_leaderboard(cfg)["best"]
    return marker["checkpoint"] == wanted and marker["location"] == str(out.resolve())


def release_memory() -> bool:
    """Hand the memory a finished stage freed back to the OS before the next one starts.

    The stages run in one process, and glibc keeps freed heap pages for reuse: on the pair
    the process still held 12.2 GB when evaluate started, 1.2 GB with this (README "The main
    job"). -> whether glibc's malloc_trim ran."""
    gc.collect()  # reference cycles (modules, optimizers) still holding tensors
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl): nothing to trim
        return False
    libc.malloc_trim(0)
    return True


def run_pipeline(cfg: Config) -> None:
    for stage in cfg.run.stages:
        if stage == "export" and _already_exported(cfg):
            from draftsmith.export import export_dir

            print(f"[export] {export_dir(cfg)} already holds the best draft; skipping")
            continue
        print(f"[{stage}] starting")
        start = time.perf_counter()
        stage_function(stage)(cfg)
        print(f"[{stage}] done in {time.perf_counter() - start:.1f}s")
        release_memory()
