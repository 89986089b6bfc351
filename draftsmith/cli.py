"""`draftsmith` command line: each subcommand is a plain function of its arguments.

    draftsmith generate|distill|evaluate|export|run CONFIG [key=value ...]
    draftsmith models pull NAME | models list

User errors (bad config, missing model, empty data) print one line and exit
non-zero (2 for config problems); `--debug` shows the traceback instead.

A stage command validates the config, checks the device, takes the run directory's lock
and runs every stage's cheap consistency checks (pipeline.preflight) before any stage
writes; the resolved config.yaml is written by the first stage that writes results
(draftsmith/rundir.py), so a command that fails its checks changes nothing on disk.
"""

from __future__ import annotations

import argparse
import errno
import sys
import traceback
from pathlib import Path

from draftsmith import pipeline
from draftsmith.config import load_config
from draftsmith.errors import DraftsmithError

STAGE_HELP = {
    "generate": (
        "Run the target over the prompt sets and store its outputs.",
        "Writes <output_dir>/data/ (an HF dataset on disk, written in resumable shards) and "
        "data/meta.json; the held-out eval prompts go to data/eval_prompts.jsonl.",
    ),
    "distill": (
        "Train the draft on the target's outputs with a KL-family loss (accelerate).",
        "Writes <output_dir>/checkpoints/checkpoint-<step>/ (HF model dirs + train state); "
        "checkpoint-0 is the untrained initialisation. Resumes from the newest checkpoint.",
    ),
    "evaluate": (
        "Run every checkpoint as a real speculative decoder against the target and rank them.",
        "Writes <output_dir>/eval/leaderboard.{json,csv}, plots and per-checkpoint results; "
        "finished checkpoints are cached and not evaluated again.",
    ),
    "export": (
        "Hand the best draft over for serving.",
        "Writes <output_dir>/export/: a clean HF model dir, speculative_config.json for vLLM "
        "and a model card README.md.",
    ),
    "run": (
        "Run the whole pipeline: generate, distill, evaluate, export.",
        "Writes everything under <output_dir>/ (see each stage); finished stages are skipped on a rerun.",
    ),
}


def note_moved_run_config(config: str, cfg, overrides: list[str]) -> None:
    """A run's own config.yaml, moved or copied with the run, still names the old run dir."""
    from draftsmith.lock import LOCK_FILE

    path = Path(config).resolve()
    if path.name != "config.yaml" or not (path.parent / LOCK_FILE).is_file():
        return  # not the config.yaml inside a run directory
    if any(o.startswith("run.output_dir=") for o in overrides):
        return
    if cfg.output_dir.resolve() != path.parent:
        print(
            f"draftsmith: note: {config} names run.output_dir {cfg.output_dir}, not the run "
            f"directory it is in; working on {cfg.output_dir} (add run.output_dir={path.parent} "
            "to work on this one)",
            file=sys.stderr,
        )


def cmd_stage(name: str, config: str, overrides: list[str]) -> int:
    from draftsmith.kinds import check_config
    from draftsmith.models import check_cpu_bf16, pick_device
    from draftsmith.quant_draft import check_quant_available
    from draftsmith.rundir import open_run_dir

    cfg = load_config(config, overrides)
    check_config(cfg)  # draft.kind's names and each kind's own keys, before anything is written
    note_moved_run_config(config, cfg, overrides)
    # run.device=cuda without a GPU, bf16 by hand on a CPU without it, int4/int8 drafts off CPU:
    # before anything is written
    device = pick_device(cfg.run.device)
    check_cpu_bf16(cfg, device)
    check_quant_available(cfg.evaluate.draft_weights, device)
    stages = cfg.run.stages if name == "run" else [name]
    with open_run_dir(cfg):
        pipeline.preflight(cfg, stages)
        pipeline.stage_function(name)(cfg)
    return 0


# A disk that is full or a directory made read-only under a running stage: the OS's own
# words and the file are the whole story, a traceback adds nothing.
_WRITE_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def cmd_models_pull(name: str, force: bool) -> int:
    from draftsmith.models import pull

    path = pull(name, force=force)
    print(path)
    return 0


def cmd_models_list() -> int:
    from draftsmith.gguf_models import human_bytes
    from draftsmith.models import REGISTRY, registry_path

    for entry in REGISTRY.values():
        path = registry_path(entry.name)
        state = f"pulled: {path}" if (path / "config.json").is_file() else "not pulled"
        size = human_bytes(entry.size_bytes) if entry.size_bytes else "size unknown"
        print(f"{entry.name:28s} {entry.description}")
        print(f"{'':28s}   {size} fp32, from {entry.source} [{state}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftsmith",
        description="Distill, verify and export draft models for speculative decoding.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (summary, writes) in STAGE_HELP.items():
        p = sub.add_parser(name, help=summary, description=f"{summary} {writes}")
        p.add_argument("config", help="YAML run config (see configs/)")
        p.add_argument(
            "overrides",
            nargs="*",
            metavar="key=value",
            help="override config fields, e.g. distill.lr=3e-4 evaluate.k_sweep=[2,4]",
        )
        p.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show tracebacks for errors",
        )

    models = sub.add_parser(
        "models",
        help="Pull or list the built-in models.",
        description="Built-in models are cached under $DRAFTSMITH_HOME/models "
        "(default ~/.cache/draftsmith/models).",
    )
    msub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    pull = msub.add_parser(
        "pull",
        help="Fetch and convert a built-in model (idempotent).",
        description="Fetch a built-in model and save it as a safetensors HF model "
        "dir in $DRAFTSMITH_HOME/models/NAME; prints the path.",
    )
    pull.add_argument("name")
    pull.add_argument("--force", action="store_true", help="rebuild even if already pulled")
    msub.add_parser(
        "list",
        help="List the built-in models and whether they are pulled.",
        description="List the built-in models and where they are cached.",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command in STAGE_HELP:
            return cmd_stage(args.command, args.config, args.overrides)
        if args.models_command == "pull":
            return cmd_models_pull(args.name, args.force)
        return cmd_models_list()
    except DraftsmithError as e:
        if args.debug:
            traceback.print_exc()
        print(f"draftsmith: error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if e.errno not in _WRITE_ERRORS or not e.filename or args.debug:
            raise
        print(f"draftsmith: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("draftsmith: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
