"""Export: the chosen draft as a clean HF model dir, a vLLM speculative config and a model card.

Reads `<output_dir>/eval/leaderboard.json` (written by evaluate) and writes
`<output_dir>/export/` (or `export.output_dir`) atomically: the directory
appears complete or not at all. What the model files are is the chosen row's kind's
business (draftsmith/kinds/ DraftKind.export): a causal-LM draft is a clean HF model dir
(vLLM method `draft_model`, or transformers' `assistant_model=`), a head on the target the
layout its serving method loads, each validated before the rename.

What export may replace: never the run directory, a directory above it, or anything
inside a stage's directory (data/, checkpoints/, eval/, ...); with export.overwrite only
a previous export, recognised by the `draftsmith_export.json` it wrote there. The draft
is taken from the leaderboard row's path relative to the run directory (a copied run
exports its own weights), its weight files are checked whole and (by its kind) in the
shapes its config.json builds, and the card states the training the checkpoint itself records.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from pathlib import Path

from draftsmith.config import Config
from draftsmith.errors import ConfigError, DraftsmithError
from draftsmith.evaluate.metrics import TARGET_SURE
from draftsmith.evaluate.records import LeaderboardRow, rows_from_dicts
from draftsmith.evaluate.report import (
    TRAINED_ROLES,
    format_category_ks,
    format_comparison,
    format_limits,
    format_recommendation,
    format_sweep,
    ranking_rows,
)
from draftsmith.io import (
    TMP_MARK,
    atomic_dir,
    atomic_write_json,
    checked_read_json,
    clean_stale_temps,
    corrupt_file,
)
from draftsmith.kinds import kind_of
from draftsmith.models import resolve_model
from draftsmith.rundir import STAGE_DIRS, from_run, is_inside, make_dir, record_config, run_relative

# Written into every export: what it holds and where it was made. Only a directory holding
# one is ever replaced (export.overwrite), and a moved export is told from one in place.
EXPORT_MARKER = "draftsmith_export.json"


def export_dir(cfg: Config) -> Path:
    return Path(cfg.export.output_dir) if cfg.export.output_dir else cfg.output_dir / "export"


def read_leaderboard(cfg: Config) -> dict:
    path = cfg.output_dir / "eval" / "leaderboard.json"
    if not path.is_file():
        raise DraftsmithError(f"{path}: no leaderboard yet; run `draftsmith evaluate CONFIG` first")
    fix = "delete it and rerun `draftsmith evaluate CONFIG` (finished results are cached)"
    board = checked_read_json(path, fix)
    if not isinstance(board, dict) or "best" not in board:
        raise corrupt_file(path, "not a draftsmith leaderboard", fix)
    if not board.get("rows"):
        raise DraftsmithError(f"{path}: the leaderboard has no rows")
    return {**board, "rows": rows_from_dicts(board["rows"], path)}


# ----------------------------------------------------------------------------- where to export


def read_export_marker(out: Path) -> dict | None:
    """The marker of a previous export in `out`, or None when `out` holds none."""
    path = Path(out) / EXPORT_MARKER
    if not path.is_file():
        return None
    fix = f"delete {out} and rerun `draftsmith export CONFIG`"
    marker = checked_read_json(path, fix)
    if not isinstance(marker, dict) or "checkpoint" not in marker:
        raise corrupt_file(path, "not an export record", fix)
    return marker


def check_export_target(cfg: Config) -> Path:
    """The export dir, once it is known not to hold anything but a previous export.

    Refused: the run directory, any directory above it, anything inside a stage's
    directory; with export.overwrite, an existing non-empty directory that is not an export.
    """
    out, run = export_dir(cfg), cfg.output_dir
    key = "export.output_dir"
    if is_inside(run, out):
        raise ConfigError(
            f"{key}: {out} is the run directory or holds it; an export there would replace "
            f"the run's data, checkpoints and results. Choose a directory outside them (the "
            f"default is {run / 'export'})"
        )
    for name in STAGE_DIRS:
        if is_inside(out, run / name):
            raise ConfigError(
                f"{key}: {out} lies inside the run's {name}/, which draftsmith writes; choose a "
                f"directory outside it (the default is {run / 'export'})"
            )
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{key}: {out} exists and is not a directory")
    foreign = out.is_dir() and any(out.iterdir()) and read_export_marker(out) is None
    if cfg.export.overwrite and foreign:
        raise DraftsmithError(
            f"{out}: not a draftsmith export (no {EXPORT_MARKER}); export.overwrite replaces "
            "only a previous export. Choose another export.output_dir, or delete it yourself"
        )
    return out


def source_dir(cfg: Config, row: LeaderboardRow) -> Path:
    """The chosen row's model dir: relative to this run dir, so a copy exports its own weights."""
    src = from_run(row.path, cfg.output_dir)
    if not (src / "config.json").is_file():
        who = "export.checkpoint" if cfg.export.checkpoint else "the leaderboard's best draft"
        raise DraftsmithError(
            f"{src}: {who} {row.checkpoint!r} is not there (deleted since evaluate?); rerun "
            "`draftsmith evaluate CONFIG` to rank what is on disk"
        )
    return src


def draft_rows(board: dict, checkpoint: str) -> list[LeaderboardRow]:
    """A draft's rows on the primary eval set: its engine row (speedup, losslessness) first
    when the engine decoded it, then its row over every prompt."""
    primary = board.get("primary_eval_set")
    rows = [
        r
        for r in board["rows"]
        if r.checkpoint == checkpoint and (primary is None or r.eval_set == primary)
    ]
    return sorted(rows, key=lambda r: r.measured_by != "engine")


def choose_row(board: dict, checkpoint: str | None) -> LeaderboardRow:
    """The row named by export.checkpoint, else the leaderboard's best (draft_rows' first)."""
    wanted = checkpoint or board["best"]
    rows = draft_rows(board, wanted)
    if rows and rows[0].role == "sanity":
        raise DraftsmithError(
            f"export.checkpoint: {wanted!r} is the target drafting for itself (a sanity "
            "check), not a draft to serve"
        )
    if rows:
        return rows[0]
    names = ", ".join(dict.fromkeys(r.checkpoint for r in board["rows"]))
    raise DraftsmithError(
        f"export.checkpoint: {wanted!r} is not on the leaderboard (have: {names})"
    )


def _fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _data_summary(cfg: Config) -> str:
    from draftsmith.data import load_data_meta

    meta_path = cfg.output_dir / "data" / "meta.json"
    if not meta_path.is_file():
        return "- (no data/meta.json found)"
    meta = load_data_meta(cfg.output_dir)
    # the sources generate recorded (what the data was made from), else the config's
    recorded = meta.get("settings", {}).get("data", {}).get("sources")
    srcs = recorded or [dataclasses.asdict(s) for s in cfg.data.sources]
    sources = ", ".join(s.get("builtin") or s.get("path") or s.get("hub") or "?" for s in srcs)
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


def _training(meta: dict | None, row: LeaderboardRow) -> str:
    """How the exported draft was trained, from its checkpoint's own record (never the config,
    which may have changed since)."""
    role, steps = row.role, row.trained_steps
    if role == "init":
        return "none: the untrained initialisation ranked best"
    if role == "baseline":
        return "an external draft (evaluate.baselines), not trained by this run"
    if meta is None:  # a row of no trained role (a script's): no checkpoint record to read
        return "not trained by this run (no checkpoint record)"
    d = meta["settings"]["distill"]
    batch = f"batch {d['batch_size']} x {d['grad_accum_steps']} accumulation, lr {d['lr']}"
    teacher, more = kind_of(row).card_training(meta["settings"])
    if role == "ce_twin":
        return (
            f"ce (plain cross-entropy on the target's outputs: the run's distill.ce_baseline "
            f"twin, which ranked above the distilled draft), {steps} steps, {batch}{more}"
        )
    return (
        f"{d['loss']} (teacher: {teacher}, temperature {d['temperature']}), {steps} steps, "
        f"{batch}{more}"
    )


def _quant_note(board: dict) -> str:
    """The card says when the numbers are those of the draft decoded with rounded weights."""
    weights = board.get("draft_weights", "as_loaded")
    if weights == "as_loaded":
        return ""
    return (
        f"\nThe draft was decoded with {weights} weights (evaluate.draft_weights): acceptance "
        f"and cost are the {weights} draft's; the exported weights are the full-precision ones."
    )


def _category_ks(board: dict) -> str:
    """The per-category recommended k, for a server that sees mostly one kind of content."""
    lines = format_category_ks(board)
    if not lines:
        return ""
    return "\n" + _capitalized(lines[0]) + "\n```\n" + "\n".join(lines[1:]) + "\n```\n"


def _limits(board: dict, k: int) -> str:
    """What the draft's own cost takes from the best sweep point, as a sentence."""
    lines = format_limits({**board, "recommended_k": k})
    return "\n" + _capitalized(lines[0]) + ".\n" if lines else ""


def _capitalized(line: str) -> str:
    """A report line as the card's sentence: its first letter upper case, the rest as is."""
    return line[:1].upper() + line[1:]


def _init(meta: dict | None, row: LeaderboardRow) -> str:
    if row.role == "baseline":
        return "external (evaluate.baselines)"
    return "not recorded (no checkpoint record)" if meta is None else meta["init"]


def _comparisons(board: dict) -> str:
    """The run's paired comparisons (distilled vs CE twin / init, the best of each kind),
    or nothing."""
    lines = [
        f"- {'[' + c['eval_set'] + '] ' if c.get('eval_set') else ''}{format_comparison(c)}"
        for c in board.get("comparisons", [])
    ]
    if not lines:
        return ""
    return "Against the run's other drafts, same prompts:\n" + "\n".join(lines) + "\n"


def _spread(row: LeaderboardRow) -> str:
    iqr = row.speedup_iqr
    return f" (per prompt: {iqr[0]:.2f}x-{iqr[1]:.2f}x, interquartile)" if iqr else ""


def _by(row: LeaderboardRow) -> str:
    if row.measured_by == "teacher_forced":
        return "teacher-forced replay (exact greedy counts)"
    return "real speculative decoding"


def _eval_sets(board: dict, checkpoint: str) -> str:
    """Per eval set: the draft's acceptance over every prompt, and per category."""
    out = []
    for row in ranking_rows(board["rows"]):
        if row.checkpoint != checkpoint:
            continue
        name = row.eval_set
        primary = " (primary)" if name == board.get("primary_eval_set") else ""
        cats = "\n".join(
            f"| {c} | {_fmt(v.acceptance_rate)} | {_fmt(v.alpha)} | "
            f"{_fmt(v.mean_accepted_length, 2)} | {v.num_prompts} |"
            for c, v in sorted(row.per_category.items())
        )
        out.append(
            f"### {name}{primary}: {row.num_prompts} prompts, {_by(row)}\n"
            f"acceptance rate {_fmt(row.acceptance_rate)}, alpha "
            f"{_fmt(row.alpha)}, {_fmt(row.mean_accepted_length, 2)} tokens per "
            f"target forward at k = {row.num_speculative_tokens}\n\n"
            "| category | acceptance rate | alpha | mean accepted length | prompts |\n"
            f"|---|---|---|---|---|\n{cats}\n"
        )
    return "\n".join(out)


def model_card(
    cfg: Config, board: dict, row: LeaderboardRow, k: int, out: Path, meta: dict | None
) -> str:
    """The README of an export; `meta` is the checkpoint's own record (None for a baseline)."""
    kind = kind_of(row)
    spec = json.dumps(kind.speculative_config(out, k))
    target = board.get("target", cfg.target.model)
    target_path = resolve_model(cfg.target.model)  # a dir or hub id that vLLM can load
    positions = ", ".join(_fmt(p, 2) for p in row.per_position_acceptance)
    sweep = "\n".join(format_sweep(board))
    lossless = row.lossless_match_rate
    verdict = {None: "(not decoded)", 1.0: "(pass)"}.get(lossless, "(FAIL)")
    return f"""# Draft model for {target}

A draft for speculative decoding, distilled and verified by draftsmith. The target
verifies every drafted token, so outputs are exactly the target's own; the draft only
changes speed.

## Draft
- checkpoint: `{row.checkpoint}` (step {row.trained_steps}), chosen by `{board.get("select_metric")}`
- kind: {kind.card_kind(meta)}
- initialisation: {_init(meta, row)}
- training: {_training(meta, row)}

## Data
{_data_summary(cfg)}

## Measured on {row.eval_set} by {_by(row)}
Measured on: {board.get("hardware", platform.platform())}, {row.num_prompts} prompts,
k = {row.num_speculative_tokens}, temperature {row.temperature}.{_quant_note(board)}

| metric | value |
|---|---|
| acceptance rate (accepted / proposed drafts) | {_fmt(row.acceptance_rate)} |
| alpha (accepted / verified drafts, per-token acceptance) | {_fmt(row.alpha)} |
| mean accepted length (tokens per target forward) | {_fmt(row.mean_accepted_length, 2)} |
| measured speedup over target-only decoding | {_fmt(row.speedup, 2)}x{_spread(row)} |
| modelled speedup (verify forward = 1 target forward) | {_fmt(row.modelled_speedup, 2)}x |
| modelled speedup (measured verify cost) | {_fmt(row.modelled_speedup_verify, 2)}x |
| draft cost ratio c (draft forward / target forward) | {_fmt(row.draft_cost_ratio)} |
| verify cost ratio v ((k+1)-token / 1-token target forward) | {_fmt(row.verify_cost_ratio, 2)} |
| lossless check (greedy output == target's own) | {_fmt(lossless)} {verdict} |
| misses where the target itself was unsure (p(own token) < {TARGET_SURE:g}) | {_fmt(row.misses_target_unsure, 2)} |
| alpha where the target was sure / unsure | {_fmt(row.alpha_target_sure)} / {_fmt(row.alpha_target_unsure)} |

Per-position acceptance (given the position was reached): {positions}

## Eval sets
{_eval_sets(board, row.checkpoint)}
{_comparisons(board)}
### k sweep on {board.get("primary_eval_set") or "the held-out prompts"}
Acceptance per k over every prompt, the modelled speedup from draft/verify costs timed in
interleaved repeats [interquartile range], the measured wall-clock speedup [interquartile
range over prompts]:
```
{sweep}
```
{format_recommendation({**board, "recommended_k": k})}.
{_limits(board, k)}{_category_ks(board)}
## Use it
{kind.card_usage(spec, target_path, out.resolve(), k)}
"""


def _log_artifact(cfg: Config, out: Path, row: LeaderboardRow) -> None:
    from draftsmith.tracking import wandb_run

    with wandb_run(cfg, "export") as run:
        if run is None:
            return
        import wandb

        meta = {
            k: v for k, v in row.to_dict().items() if isinstance(v, (int, float, str, list, dict))
        }
        art = wandb.Artifact(name=f"draft-{cfg.output_dir.name}", type="model", metadata=meta)
        art.add_dir(str(out))
        run.log_artifact(art)


def _refuse_existing(out: Path) -> None:
    """An existing export dir without export.overwrite: say what it holds and how to redo it."""
    marker = read_export_marker(out)
    moved = marker is not None and marker.get("location") != str(out.resolve())
    made = f" (made at {marker['location']}; moved or copied since)" if moved else ""
    raise DraftsmithError(
        f"{out}: export dir exists{made}; set export.overwrite=true to replace it"
    )


def run_export(cfg: Config) -> Path:
    from draftsmith.distill.checkpoint import read_meta
    from draftsmith.integrity import check_weight_files

    out = check_export_target(cfg)
    if out.exists() and not cfg.export.overwrite:
        _refuse_existing(out)
    board = read_leaderboard(cfg)
    row = choose_row(board, cfg.export.checkpoint)
    src = source_dir(cfg, row)
    meta = read_meta(src) if row.role in TRAINED_ROLES else None
    check_weight_files(src)  # a truncated source: named before anything is copied
    k = int(
        board.get("recommended_k")
        or row.num_speculative_tokens
        or cfg.evaluate.num_speculative_tokens
    )
    make_dir(out.parent, "export.output_dir")
    record_config(cfg)
    clean_stale_temps(out.parent, prefix=out.name + TMP_MARK)  # a killed export's temp dir
    kind = kind_of(row)
    with atomic_dir(out, overwrite=cfg.export.overwrite) as tmp:
        kind.export(cfg, src, k, tmp, out)  # model files + speculative_config.json, validated
        atomic_write_json(tmp / "leaderboard_row.json", row.to_dict())
        (tmp / "README.md").write_text(model_card(cfg, board, row, k, out, meta))
        atomic_write_json(
            tmp / EXPORT_MARKER,
            {
                "checkpoint": row.checkpoint,
                "source": run_relative(src, cfg.output_dir),
                "run_dir": str(cfg.output_dir.resolve()),
                "location": str(out.resolve()),
                "num_speculative_tokens": k,
                "export": dataclasses.asdict(cfg.export),
            },
        )
    _log_artifact(cfg, out, row)
    print(f"exported {row.checkpoint} ({kind.name}) to {out} (recommended k={k})")
    return out
