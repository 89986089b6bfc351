"""`draftsmith run`: the four stages in order, each resuming from what is on disk."""

from __future__ import annotations

import json
import time

from draftsmith.config import Config
from draftsmith.export import export_dir


def _already_exported(cfg: Config) -> bool:
    """True when export/ holds the leaderboard's current choice (a rerun has nothing to do)."""
    row_path = export_dir(cfg) / "leaderboard_row.json"
    board_path = cfg.output_dir / "eval" / "leaderboard.json"
    if not (row_path.is_file() and board_path.is_file()):
        return False
    wanted = cfg.export.checkpoint or json.loads(board_path.read_text())["best"]
    return json.loads(row_path.read_text())["checkpoint"] == wanted


def run_pipeline(cfg: Config) -> None:
    from draftsmith.cli import _stage_function

    for stage in cfg.run.stages:
        if stage == "export" and _already_exported(cfg):
            print(f"[export] {export_dir(cfg)} already holds the best draft; skipping")
            continue
        print(f"[{stage}] starting")
        start = time.perf_counter()
        _stage_function(stage)(cfg)
        print(f"[{stage}] done in {time.perf_counter() - start:.1f}s")
