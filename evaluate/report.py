"""Leaderboard files, the printed table and the W&B log of an evaluation (the PNG plots:
evaluate/plots.py).

A leaderboard holds rows for every eval set; within a set, a draft has one row over every
prompt (`measured_by` "teacher_forced" when greedy, "engine" when sampled) and, for the
drafts the engine decoded, one "engine" row over its prompts. `ranking_rows` picks the
former: the rows drafts are ranked, plotted and compared by.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

from draftsmith.config import Config
from draftsmith.evaluate import metrics
from draftsmith.evaluate.plots import (
    plot_eval_sets,
    plot_k_sweep,
    plot_per_position,
    plot_training_curves,
)
from draftsmith.evaluate.records import CONFIDENCE_KEYS, LeaderboardRow, sweep_label
from draftsmith.io import atomic_write_json, atomic_write_text

# The figures that describe one draft at one k, with their table titles and formats: the
# one list behind the printed table, the CSV and every k-sweep entry.
METRIC_COLUMNS = (
    ("acceptance_rate", "accept", "{:.3f}"),
    ("alpha", "alpha", "{:.3f}"),
    ("mean_accepted_length", "tok/fwd", "{:.2f}"),
    ("speedup", "speedup", "{:.2f}x"),
    ("modelled_speedup", "modelled", "{:.2f}x"),
    ("modelled_speedup_verify", "modelled(v)", "{:.2f}x"),
    ("draft_cost_ratio", "c", "{:.3f}"),
    ("verify_cost_ratio", "v", "{:.2f}"),
    ("lossless_match_rate", "lossless", "{:.2f}"),
    ("tokens_per_s", "tok/s", "{:.1f}"),
)
METRIC_KEYS = tuple(key for key, _, _ in METRIC_COLUMNS)
# Acceptance split by whether the target's token copies the prompt (metrics.echo_split).
ECHO_COLUMNS = (
    ("echo_share", "echo", "{:.2f}"),
    ("alpha_new", "alpha(new)", "{:.3f}"),
)
# Drafts this run trained (evaluate/prompts.py list_drafts): their checkpoints record how.
TRAINED_ROLES = ("init", "distilled", "ce_twin")
TABLE_COLUMNS = (
    ("checkpoint", "checkpoint", "{}"),
    ("kind", "kind", "{}"),
    ("step", "step", "{}"),
    ("measured_by", "by", "{}"),
    ("num_prompts", "n", "{}"),
    *METRIC_COLUMNS[:3],
    *ECHO_COLUMNS,
    ("speedup", "speedup", "{:.2f}x"),
    ("speedup_iqr", "(IQR)", "{:.2f}"),
    *METRIC_COLUMNS[4:],
)
BY_SHORT = {"teacher_forced": "tf", "engine": "engine"}
BY_COLUMN = [key for key, _, _ in TABLE_COLUMNS].index("measured_by")
CSV_FIELDS = (
    "checkpoint",
    "kind",
    "step",
    *METRIC_KEYS,
    "echo_share",
    "alpha_echo",
    "alpha_new",
    *CONFIDENCE_KEYS,
    "num_speculative_tokens",
    "temperature",
    "target_tokens_per_s",
    "num_prompts",
    "tokens_proposed",
    "tokens_accepted",
    "target_forwards",
    "per_position_acceptance",
    "path",
    "eval_set",
    "measured_by",
    "speedup_iqr",
)


def _cell(value, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, list) and fmt != "{}":  # an interquartile range: lo-hi
        return "-".join(fmt.format(v) for v in value)
    if isinstance(value, list):
        return ";".join("" if v is None else f"{v:.4f}" for v in value)
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def leaderboard_csv(rows: list[LeaderboardRow]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(CSV_FIELDS)
    for row in rows:
        values = [getattr(row, f) for f in CSV_FIELDS]
        writer.writerow(["" if v is None else _cell(v, "{}") for v in values])
    return buf.getvalue()


def ranking_rows(rows: list[LeaderboardRow], eval_set: str | None = None) -> list[LeaderboardRow]:
    """Per (set, draft) the row over every prompt: teacher-forced where there is one, else
    the engine's (sampled, or vLLM)."""
    chosen: dict[tuple, LeaderboardRow] = {}
    for r in rows:
        if eval_set is not None and r.eval_set != eval_set:
            continue
        key = (r.eval_set, r.checkpoint)
        if key not in chosen or r.measured_by == "teacher_forced":
            chosen[key] = r
    return list(chosen.values())


def _grid(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *body)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _row_table(rows: list[LeaderboardRow], best: str | None) -> list[str]:
    body = []
    for row in rows:
        cells = [_cell(getattr(row, key), fmt) for key, _, fmt in TABLE_COLUMNS]
        cells[BY_COLUMN] = BY_SHORT.get(row.measured_by, cells[BY_COLUMN])
        if row.checkpoint == best:
            cells[0] = "*" + cells[0]
        body.append(cells)
    return _grid([title for _, title, _ in TABLE_COLUMNS], body)


def category_table(rows: list[LeaderboardRow]) -> list[str]:
    """Alpha and tokens per target forward per category (columns) of each draft (lines):
    its ranking row."""
    ranked = ranking_rows(rows)
    cats = sorted({c for r in ranked for c in r.per_category})
    if len(cats) < 2:
        return []

    def cell(row: LeaderboardRow, cat: str) -> str:
        m = row.per_category.get(cat)
        if m is None or m.alpha is None:
            return "-"
        return f"{m.alpha:.3f} ({_cell(m.mean_accepted_length, '{:.2f}')})"

    body = [[r.checkpoint] + [cell(r, c) for c in cats] for r in ranked]
    title = "alpha (tokens per target forward) per category:"
    return [title, *_grid(["checkpoint", *cats], body)]


def misses_table(rows: list[LeaderboardRow]) -> list[str]:
    """Per draft (its ranking row), its misses split by the target's own confidence there
    (metrics.confidence_split): the share distillation cannot fix by teaching what the
    target is sure of."""
    ranked = [r for r in ranking_rows(rows) if r.confidence is not None]
    if not ranked:
        return []
    lines = [f"where the drafts miss (the target sure: p(own token) >= {metrics.TARGET_SURE:g}):"]
    for r in ranked:
        c = r.confidence
        lines.append(
            f"  {r.checkpoint}: {_cell(c.misses_target_unsure, '{:.0%}')} of its misses where "
            f"the target is unsure; alpha {_cell(c.alpha_target_sure, '{:.3f}')} where it is "
            f"sure ({_cell(c.target_sure_share, '{:.0%}')} of judged drafts), "
            f"{_cell(c.alpha_target_unsure, '{:.3f}')} elsewhere"
        )
    return lines


def _set_heading(board: dict, name: str) -> str:
    info = board.get("eval_sets", {}).get(name, {})
    primary = (
        " (primary: best draft and k chosen here)" if name == board.get("primary_eval_set") else ""
    )
    engine = info.get("engine_prompts")
    size = f"{info.get('num_prompts')} prompts, engine on {engine}" if info else ""
    return f"== eval set {name}{primary}: {size} ==" if size else f"== eval set {name}{primary} =="


def format_sweep(board: dict) -> list[str]:
    """The k sweep, one line per k: acceptance, the modelled speedup from timed costs and the
    wall clock, each with its interquartile range."""
    lines = []
    for s in board.get("k_sweep", []):
        parts = [
            f"{sweep_label(s)}: accept {_cell(s.get('acceptance_rate'), '{:.3f}')}",
            f"tok/fwd {_cell(s.get('mean_accepted_length'), '{:.2f}')}",
            f"modelled {_cell(s.get('modelled_speedup_verify'), '{:.2f}x')} "
            f"[{_cell(s.get('modelled_speedup_iqr'), '{:.2f}')}] "
            f"(c {_cell(s.get('draft_cost_ratio'), '{:.3f}')}, "
            f"v {_cell(s.get('verify_cost_ratio'), '{:.2f}')})",
            f"measured {_cell(s.get('speedup'), '{:.2f}x')} [{_cell(s.get('speedup_iqr'), '{:.2f}')}]",
        ]
        if s.get("modelled_speedup_in_run") is not None:  # same prompts, the run's own forwards
            parts.append(f"in-run model {s['modelled_speedup_in_run']:.2f}x")
        if s.get("modelled_request_in_run") is not None:  # ... with the prompt prefills
            parts.append(f"with prefills {s['modelled_request_in_run']:.2f}x")
        if s.get("second_choices_verified") is not None:
            parts.append(
                f"second choices emitted {s['second_choices_emitted']} of "
                f"{s['second_choices_verified']} verified"
            )
        lines.append("  " + ", ".join(parts))
    return lines


def format_recommendation(board: dict) -> str:
    """Which k, by which figure, and whether the spreads allow ranking it first."""
    rec = board.get("k_recommendation") or {}
    k = board["recommended_k"]
    if not rec.get("by"):
        return f"recommended k = {k}"
    figure = "the measured speedup" if rec["by"] == "speedup" else "the modelled speedup"
    timed_costs = rec["by"] == "modelled_speedup_verify"
    how = f"{figure} (acceptance per k x timed costs)" if timed_costs else figure
    line = f"recommended k = {k}, by {how}"
    if rec.get("runner_up") is not None:
        line += (
            f"; clear of k={rec['runner_up']}"
            if rec.get("clear")
            else f"; the spread is too wide to rank it above k={rec['runner_up']} "
            "(interquartile ranges overlap)"
        )
    wall = rec.get("wall_clock")
    if wall and rec["by"] != "speedup":
        verdict = "clear" if wall["clear"] else "spread too wide to rank"
        at = f" at {wall['value']:.2f}x" if wall.get("value") is not None else ""
        line += f". Wall clock ranks k={wall['k']} first{at} ({verdict})"
    dyn = rec.get("dynamic")
    if rec.get("pays") is False:
        best = rec.get("measured") or dyn or rec
        by = "the wall clock (its interquartile range below 1.0x)" if "measured" in rec else figure
        return line + (
            f". No point of the sweep is faster than the target alone: the best, "
            f"{sweep_label(best)}, is {best['value']:.2f}x by {by}. On this "
            "machine serve the target without a draft: its steps and the verify forward "
            "cost more than the tokens it gets accepted save"
        )
    if dyn:
        how = []
        if dyn.get("stop_threshold") is not None:
            how.append(f"stopping after a draft below probability {dyn['stop_threshold']:g}")
        if dyn.get("second_choice_min") is not None:
            how.append(
                f"verifying the draft's second choices where it rates them >= "
                f"{dyn['second_choice_min']:g} (native engine)"
            )
        line += f". {sweep_label(dyn)} ranks above every fixed k: " + " and ".join(how)
    return line


def best_sweep_point(board: dict) -> dict | None:
    """The sweep point the recommendation ranks first: the dynamic one where it ranks above
    every fixed k, else the recommended k; None when the sweep lacks it."""
    rec = board.get("k_recommendation") or {}
    want = rec.get("dynamic") or {"k": board.get("recommended_k")}
    keys = ("k", "stop_threshold", "second_choice_min")
    return next(
        (s for s in board.get("k_sweep", []) if all(s.get(x) == want.get(x) for x in keys)), None
    )


def format_limits(board: dict) -> list[str]:
    """One line on what the draft's own cost takes from the best sweep point: its share of a
    round, and the ceiling of the same acceptance with free draft steps (metrics.draft_share,
    metrics.free_draft_speedup); none without timed costs."""
    s = best_sweep_point(board)
    if s is None or s.get("draft_share") is None:
        return []
    return [
        f"what limits {sweep_label(s)}: its draft steps take {s['draft_share']:.0%} of a round "
        f"(modelled {s['modelled_speedup_verify']:.2f}x); with draft steps that cost nothing "
        f"the same rounds would give {s['modelled_speedup_free_draft']:.2f}x, the most a "
        "cheaper draft of this acceptance can reach"
    ]


def format_category_ks(board: dict) -> list[str]:
    """The recommended k per category, one line each: the modelled speedup it was chosen by
    and the engine's wall clock at that k on the category's engine prompts."""
    by_cat = board.get("k_by_category") or {}
    if not by_cat:
        return []
    lines = ["recommended k per category (its own acceptance, the run's costs):"]
    for cat, r in by_cat.items():
        runner = ""
        if r.get("runner_up") is not None and not r.get("clear"):
            runner = f", not clear of k={r['runner_up']}"
        measured = ""
        if r.get("speedup") is not None:
            n = r.get("engine_prompts")
            measured = f", measured {r['speedup']:.2f}x on {n} prompt{'s' * (n != 1)}"
        loses = "; no k is faster than the target alone" if r.get("pays") is False else ""
        lines.append(
            f"  {cat}: k={r['k']} (alpha {_cell(r.get('alpha'), '{:.3f}')}, modelled "
            f"{_cell(r.get('modelled_speedup_verify'), '{:.2f}x')}{measured}{runner}{loses})"
        )
    return lines


def format_table(board: dict) -> str:
    """A plain-text leaderboard per eval set (the best draft's rows marked with '*'), the k
    sweep, the recommended k and the paired comparisons."""
    lines = []
    primary = board.get("primary_eval_set")
    for name in dict.fromkeys(r.eval_set for r in board["rows"]):
        rows = [r for r in board["rows"] if r.eval_set == name]
        lines.append(_set_heading(board, name))
        lines += _row_table(rows, board["best"] if name == primary else None)
        lines += category_table(rows)
        lines += misses_table(rows)
    where = f" on {primary}" if primary else ""
    lines.append(f"best: {board['best']} by {board['select_metric']}{where}; k sweep:")
    lines += format_sweep(board)
    lines.append(format_recommendation(board))
    lines += format_limits(board)
    lines += format_category_ks(board)
    for c in board.get("comparisons", []):
        prefix = f"[{c['eval_set']}] " if c.get("eval_set") else ""
        lines.append(prefix + format_comparison(c))
    return "\n".join(lines)


def format_comparison(c: dict) -> str:
    """One line: the acceptance difference, its paired-bootstrap interval, and the verdict."""
    lo, hi = c["ci95"]
    if lo > 0:
        verdict = "better"
    elif hi < 0:
        verdict = "worse"
    else:
        verdict = "not distinguishable on these prompts"
    line = (
        f"{c['draft']} vs {c['against']}: acceptance {c['diff']:+.3f} (95% CI {lo:+.3f} to "
        f"{hi:+.3f}, paired bootstrap over {c['num_prompts']} prompts): {verdict}"
    )
    if c.get("alpha_ci95"):
        line += f"; alpha {_diff_ci(c)}"
    per_cat = {cat: d for cat, d in (c.get("per_category") or {}).items() if d and d["alpha_ci95"]}
    if per_cat:
        line += "\n    alpha per category: " + ", ".join(
            f"{cat} {_diff_ci(d)}" for cat, d in per_cat.items()
        )
    return line


def _diff_ci(d: dict) -> str:
    """alpha difference with its interval, starred when the interval excludes zero."""
    lo, hi = d["alpha_ci95"]
    star = "*" if lo > 0 or hi < 0 else ""
    return f"{d['alpha_diff']:+.3f}{star} ({lo:+.3f}..{hi:+.3f})"


# ----------------------------------------------------------------------------- W&B


def log_wandb(cfg: Config, board: dict, images: list[Path]) -> None:
    from draftsmith.tracking import wandb_run

    with wandb_run(cfg, "evaluate") as run:
        if run is None:
            return
        import wandb

        run.define_metric("eval/step")
        run.define_metric("eval/*", step_metric="eval/step")
        primary = board.get("primary_eval_set")
        by_step: dict[int, dict] = {}
        for row in ranking_rows(board["rows"]):
            if row.step is None:
                continue
            logged = by_step.setdefault(row.step, {"eval/step": row.step})
            for k in ("acceptance_rate", "alpha", "mean_accepted_length"):
                if getattr(row, k) is not None:
                    logged[f"eval/{row.eval_set}/{k}"] = getattr(row, k)
                    if row.eval_set == primary:
                        logged[f"eval/{k}"] = getattr(row, k)
        for step in sorted(by_step):
            run.log(by_step[step])
        table = wandb.Table(columns=list(CSV_FIELDS))
        for row in board["rows"]:
            values = [getattr(row, f) for f in CSV_FIELDS]
            table.add_data(*[json.dumps(v) if isinstance(v, list) else v for v in values])
        cols = ["k", "acceptance_rate", "modelled_speedup_verify", "speedup"]
        sweep = wandb.Table(columns=["setting", *cols])
        for s in board["k_sweep"]:
            sweep.add_data(sweep_label(s), *[s.get(c) for c in cols])
        run.log(
            {
                "leaderboard": table,
                "k_sweep": sweep,
                **{f"plots/{p.stem}": wandb.Image(str(p)) for p in images},
            }
        )
        run.summary.update(
            {
                "best": board["best"],
                "recommended_k": board["recommended_k"],
                "recommended_k_by_category": {
                    cat: r["k"] for cat, r in (board.get("k_by_category") or {}).items()
                },
                "primary_eval_set": primary,
            }
        )


def best_row(board: dict) -> LeaderboardRow:
    """The best draft's ranking row on the primary set."""
    rows = ranking_rows(board["rows"], board.get("primary_eval_set"))
    return next(r for r in rows if r.checkpoint == board["best"])


def portable_board(cfg: Config, board: dict) -> dict:
    """The board as recorded: draft paths relative to the run dir (a copied or moved run
    keeps pointing at its own files), each row with what its draft was trained with (from
    the checkpoint's own record, not the config), and the evaluate settings it ran with."""
    from draftsmith.distill.checkpoint import read_meta
    from draftsmith.rundir import from_run, run_relative

    rows = []
    for row in board["rows"]:
        row = dataclasses.replace(row, path=run_relative(row.path, cfg.output_dir))
        if row.role in TRAINED_ROLES:
            meta = read_meta(from_run(row.path, cfg.output_dir))
            row.trained_with = {"init": meta["init"], **meta["settings"]}
        rows.append(row)
    best_path = run_relative(board["best_path"], cfg.output_dir)
    return {
        **board,
        "best_path": best_path,
        "rows": rows,
        "evaluate": dataclasses.asdict(cfg.evaluate),
    }


def board_json(board: dict) -> dict:
    """The board as leaderboard.json holds it: each row as the dict it writes."""
    return {**board, "rows": [r.to_dict() for r in board["rows"]]}


def write_reports(cfg: Config, board: dict, eval_dir: Path) -> None:
    eval_dir = Path(eval_dir)
    board = portable_board(cfg, board)
    atomic_write_json(eval_dir / "leaderboard.json", board_json(board))
    atomic_write_text(eval_dir / "leaderboard.csv", leaderboard_csv(board["rows"]))
    primary = ranking_rows(board["rows"], board.get("primary_eval_set"))
    images = [
        plot_training_curves(primary, eval_dir / "acceptance_vs_step.png"),
        plot_eval_sets(ranking_rows(board["rows"]), eval_dir / "acceptance_by_set.png"),
        plot_per_position(best_row(board), eval_dir / "per_position_best.png"),
        plot_k_sweep(board["k_sweep"], eval_dir / "k_sweep.png"),
    ]
    print(format_table(board))
    print(f"[evaluate] wrote {eval_dir / 'leaderboard.json'}")
    log_wandb(cfg, board, [p for p in images if p is not None])
