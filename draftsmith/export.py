"""Export: the chosen draft as its serving stack loads it, a vLLM speculative config and a model card.

Reads `<output_dir>/eval/leaderboard.json` (written by evaluate) and writes
`<output_dir>/export/` (or `export.output_dir`) atomically: the directory
appears complete or not at all. What the model files are is the chosen row's kind's
business (draftsmith/kinds.py): an independent draft is a clean HF model dir (vLLM
method `draft_model`, or transformers' `assistant_model=`), an eagle3 head the
speculators layout (vLLM method `eagle3`), validated before the rename.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

from draftsmith.config import Config
from draftsmith.errors import DraftsmithError
from draftsmith.evaluate.report import format_comparison
from draftsmith.hf_export import (  # noqa: F401 (re-exported: callers import them from here)
    assistant_generation_config,
    fixed_k_assistant,
)
from draftsmith.io import atomic_dir, atomic_write_json
from draftsmith.kinds import get_kind
from draftsmith.models import resolve_model


def export_dir(cfg: Config) -> Path:
    return Path(cfg.export.output_dir) if cfg.export.output_dir else cfg.output_dir / "export"


def read_leaderboard(cfg: Config) -> dict:
    path = cfg.output_dir / "eval" / "leaderboard.json"
    if not path.is_file():
        raise DraftsmithError(f"{path}: no leaderboard yet; run `draftsmith evaluate CONFIG` first")
    board = json.loads(path.read_text())
    if not board.get("rows"):
        raise DraftsmithError(f"{path}: the leaderboard has no rows")
    return board


def choose_row(board: dict, checkpoint: str | None) -> dict:
    """The row named by export.checkpoint, else the leaderboard's best."""
    wanted = checkpoint or board["best"]
    for row in board["rows"]:
        if row["checkpoint"] == wanted:
            return row
    names = ", ".join(r["checkpoint"] for r in board["rows"])
    raise DraftsmithError(
        f"export.checkpoint: {wanted!r} is not on the leaderboard (have: {names})"
    )


def _fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _data_summary(cfg: Config) -> str:
    meta_path = cfg.output_dir / "data" / "meta.json"
    if not meta_path.is_file():
        return "- (no data/meta.json found)"
    meta = json.loads(meta_path.read_text())
    sources = ", ".join(s.builtin or s.path or s.hub or "?" for s in cfg.data.sources)
    keys = (
        "num_prompts",
        "num_completions",
        "num_completion_tokens",
        "num_eval_prompts",
        "num_skipped",
    )
    facts = ", ".join(f"{k.replace('num_', '')}: {meta[k]}" for k in keys if k in meta)
    out = f"- prompt sources: {sources}\n- {facts}"
    sampling = meta.get("sampling")
    if sampling:  # greedy or sampled target text changes what the losses learn (README)
        t = sampling.get("temperature")
        how = "greedy" if t == 0 else f"sampled at temperature {t}, top-p {sampling.get('top_p')}"
        out += f"\n- target outputs: {how}, at most {sampling.get('max_new_tokens')} new tokens"
    return out


def _training(cfg: Config, row: dict) -> str:
    """How the exported draft was trained: its own loss, not just the run's configured one."""
    d = cfg.distill
    role, steps = row.get("role"), row.get("trained_steps", row.get("step"))
    batch = f"batch {d.batch_size} x {d.grad_accum_steps} accumulation, lr {d.lr}"
    if role == "init":
        return "none: the untrained initialisation ranked best"
    if role == "baseline":
        return "an external draft (evaluate.baselines), not trained by this run"
    teacher, more = get_kind(row.get("kind", "independent")).card_training(cfg)
    if role == "ce_twin":
        return (
            f"ce (plain cross-entropy on the target's outputs: the run's distill.ce_baseline "
            f"twin, which ranked above the {d.loss} draft), {steps} steps, {batch}{more}"
        )
    return (
        f"{d.loss} (teacher: {teacher}, temperature {d.temperature}), {steps} steps, {batch}{more}"
    )


def _comparisons(board: dict) -> str:
    """The run's paired comparisons (distilled vs CE twin / init), or nothing."""
    lines = [f"- {format_comparison(c)}" for c in board.get("comparisons", [])]
    if not lines:
        return ""
    return "Against the run's other drafts, same prompts:\n" + "\n".join(lines) + "\n"


def model_card(cfg: Config, board: dict, row: dict, k: int, out: Path, spec: dict) -> str:
    """`out`: the export's files (its final place or the temp dir it is built in)."""
    target = board.get("target", cfg.target.model)
    target_path = resolve_model(cfg.target.model)  # a dir or hub id that vLLM can load
    kind = get_kind(row.get("kind", "independent"))
    init = kind.card_draft(cfg, out)
    cats = "\n".join(
        f"| {c} | {_fmt(v.get('acceptance_rate'))} | {_fmt(v.get('mean_accepted_length'), 2)} | "
        f"{v.get('num_prompts', '')} |"
        for c, v in sorted(row.get("per_category", {}).items())
    )
    positions = ", ".join(_fmt(p, 2) for p in row.get("per_position_acceptance", []))
    sweep = "\n".join(
        f"| {s['k']} | {_fmt(s.get('acceptance_rate'))} | {_fmt(s.get('mean_accepted_length'), 2)} | "
        f"{_fmt(s.get('speedup'), 2)} | {_fmt(s.get('modelled_speedup'), 2)} |"
        for s in board.get("k_sweep", [])
    )
    lossless = row.get("lossless_match_rate")
    return f"""# Draft model for {target}

A draft for speculative decoding, distilled and verified by draftsmith. The target
verifies every drafted token, so outputs are exactly the target's own; the draft only
changes speed.

## Draft
- checkpoint: `{row["checkpoint"]}` (step {row.get("trained_steps", row.get("step"))}), chosen by `{board.get("select_metric")}`
- kind: {row.get("kind", "independent")}
- initialisation: {init}
- training: {_training(cfg, row)}

## Data
{_data_summary(cfg)}

## Measured (held-out prompts, real speculative decoding)
Measured on: {board.get("hardware", platform.platform())}, {row.get("num_prompts")} prompts,
k = {row.get("num_speculative_tokens")}, temperature {row.get("temperature")}.

| metric | value |
|---|---|
| acceptance rate (accepted / proposed drafts) | {_fmt(row.get("acceptance_rate"))} |
| alpha (accepted / verified drafts, per-token acceptance) | {_fmt(row.get("alpha"))} |
| mean accepted length (tokens per target forward) | {_fmt(row.get("mean_accepted_length"), 2)} |
| measured speedup over target-only decoding | {_fmt(row.get("speedup"), 2)}x |
| modelled speedup (verify forward = 1 target forward) | {_fmt(row.get("modelled_speedup"), 2)}x |
| modelled speedup (measured verify cost) | {_fmt(row.get("modelled_speedup_verify"), 2)}x |
| draft cost ratio c (draft forward / target forward) | {_fmt(row.get("draft_cost_ratio"))} |
| verify cost ratio v ((k+1)-token / 1-token target forward) | {_fmt(row.get("verify_cost_ratio"), 2)} |
| lossless check (greedy output == target's own) | {_fmt(lossless)} {"(pass)" if lossless == 1.0 else "(FAIL)"} |

Per-position acceptance (given the position was reached): {positions}

| category | acceptance rate | mean accepted length | prompts |
|---|---|---|---|
{cats}

{_comparisons(board)}
### k sweep (recommended k = {k})
| k | acceptance rate | mean accepted length | measured speedup | modelled speedup |
|---|---|---|---|---|
{sweep}

## Use it
{kind.card_usage(json.dumps(spec), target_path, Path(spec["model"]), k)}
"""


def _log_artifact(cfg: Config, out: Path, row: dict) -> None:
    from draftsmith.tracking import wandb_run

    with wandb_run(cfg, "export") as run:
        if run is None:
            return
        import wandb

        meta = {k: v for k, v in row.items() if isinstance(v, (int, float, str, list, dict))}
        art = wandb.Artifact(name=f"draft-{cfg.output_dir.name}", type="model", metadata=meta)
        art.add_dir(str(out))
        run.log_artifact(art)


def run_export(cfg: Config) -> Path:
    out = export_dir(cfg)
    if out.exists() and not cfg.export.overwrite:
        raise DraftsmithError(f"{out}: export dir exists; set export.overwrite=true to replace it")
    board = read_leaderboard(cfg)
    row = choose_row(board, cfg.export.checkpoint)
    k = int(
        board.get("recommended_k")
        or row.get("num_speculative_tokens")
        or cfg.evaluate.num_speculative_tokens
    )
    kind = get_kind(row.get("kind", "independent"))
    with atomic_dir(out, overwrite=cfg.export.overwrite) as tmp:
        kind.export(cfg, row, k, tmp, out)
        spec = json.loads((tmp / "speculative_config.json").read_text())
        atomic_write_json(tmp / "leaderboard_row.json", row)
        (tmp / "README.md").write_text(model_card(cfg, board, row, k, tmp, spec))
    _log_artifact(cfg, out, row)
    print(f"exported {row['checkpoint']} ({kind.name}) to {out} (recommended k={k})")
    return out
