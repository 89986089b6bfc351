"""The stage registry and `draftsmith run`: the four stages in order, each resuming from disk.

The CLI imports this module, never the reverse: which function runs a stage is the
pipeline's business, the CLI only parses arguments.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from draftsmith.config import Config


def stage_function(name: str) -> Callable[[Config], object]:
    """The entry point of stage `name` (generate, distill, evaluate, export or run)."""
    # Imported lazily: `draftsmith --help` must not pay for torch and transformers.
    if name == "generate":
        from draftsmith.data.stage import run_generate as fn
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


def _already_exported(cfg: Config) -> bool:
    """True when export/ holds the leaderboard's current choice (a rerun has nothing to do)."""
    from draftsmith.export import export_dir

    row_path = export_dir(cfg) / "leaderboard_row.json"
    board_path = cfg.output_dir / "eval" / "leaderboard.json"
    if not (row_path.is_file() and board_path.is_file()):
        return False
    wanted = cfg.export.checkpoint or json.loads(board_path.read_text())["best"]
    return json.loads(row_path.read_text())["checkpoint"] == wanted


def preflight(cfg: Config) -> None:
    """Checks of the configured kinds against the target's config and tokenizer (no
    weights), so a target an eagle3 head cannot be built on fails before generate runs."""
    if cfg.draft.kinds == ["independent"] or "distill" not in cfg.run.stages:
        return
    from draftsmith.kinds import check_target
    from draftsmith.models import load_target_config, load_target_tokenizer
    from draftsmith.vocab import token_id_count

    num_ids = token_id_count(load_target_tokenizer(cfg.target))
    check_target(cfg, load_target_config(cfg.target), num_ids)


def run_pipeline(cfg: Config) -> None:
    preflight(cfg)
    for stage in cfg.run.stages:
        if stage == "export" and _already_exported(cfg):
            from draftsmith.export import export_dir

            print(f"[export] {export_dir(cfg)} already holds the best draft; skipping")
            continue
        print(f"[{stage}] starting")
        start = time.perf_counter()
        stage_function(stage)(cfg)
        print(f"[{stage}] done in {time.perf_counter() - start:.1f}s")
