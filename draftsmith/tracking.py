"""Weights & Biases, offline by default so nothing needs a network.

`wandb_run(cfg, job_type)` yields a wandb run (or None when disabled). Runs
write under `<output_dir>/wandb/`. The resolved config is logged, never an API
key: wandb reads WANDB_API_KEY from the environment itself, and the config
schema has no field for one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from draftsmith.config import Config, config_to_dict


@contextmanager
def wandb_run(cfg: Config, job_type: str) -> Iterator[object | None]:
    wcfg = cfg.tracking.wandb
    if wcfg.mode == "disabled":
        yield None
        return
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    wandb_dir = cfg.output_dir / "wandb"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=wcfg.project,
        entity=wcfg.entity,
        name=f"{wcfg.name or cfg.output_dir.name}-{job_type}",
        group=wcfg.name or cfg.output_dir.name,
        job_type=job_type,
        tags=list(wcfg.tags),
        mode=wcfg.mode,
        dir=str(wandb_dir),
        config=config_to_dict(cfg),
        reinit="finish_previous",
    )
    try:
        yield run
    finally:
        run.finish()
